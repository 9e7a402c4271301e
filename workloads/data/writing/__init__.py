"""Writing datasets: image folders and typed records packed into shards.

pack.py (image folders), records_pack.py (captions, tokens, any records), sources.py (local trees and buckets as
inputs), shardplan.py (shard boundaries from the listing alone), slices.py (slice I of N packs its planned shards).
May import: format, moving (s3 client, the upload stream, metrics).
"""
