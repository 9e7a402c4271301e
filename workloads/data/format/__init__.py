"""The format: what a packed dataset is on disk, shared by writers, movers and readers.

manifest.py (shards + manifest.json, names, limits, atomic writes), records.py (the records schema: typed fields),
jpeg.py (how an encoded sample decodes), verify.py (a dataset checked against its manifest).
May import: workloads.safeio and the standard/third-party libraries; nothing else of workloads.data.
"""
