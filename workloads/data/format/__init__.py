"""The format: what a packed dataset is on disk, shared by writers, movers and readers.

manifest.py (shards + manifest.json, names, limits, atomic writes), records.py (the records schema: typed fields),
documents.py (document boundaries), jpeg.py (how a stored image decodes), verify.py (a dataset checked against its
manifest), errors.py (the tools' one-line error).
May import: workloads.safeio and the standard/third-party libraries; nothing else of workloads.data.
"""
