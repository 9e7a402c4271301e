"""Writing datasets: image folders and typed records packed into shards.

engine.py (the pack engine: temporary files, names, upload, publish, the old dataset), samples.py (the sample
pipeline: decode, convert, resize, worker init), pack.py (image folders: the version-1 shard writer), records_pack.py
(any records: the records shard writer) + captions.py (pack-captions) + tokens.py (pack-tokens), records_slices.py +
tables.py + maphook.py (pack-tables), sources.py (local trees and buckets as inputs), shardplan.py (shard boundaries
from the listing alone), slices.py (slice I of N packs its planned shards).
May import: format, moving (s3 client, the upload stream, metrics).
"""
