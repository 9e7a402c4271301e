"""Moving datasets: between local disk and object storage, and onto a node's NVMe.

s3.py (URIs, client, retries), upload.py, the stager: stage.py (what to hold: budget, plan order, evictions, the
published state) + shard_fetch.py (parallel ranged GETs into verified files) + reader_watch.py (the reader's plan and
the waits on it) + mixture_stage.py (a mixture's sources under one budget), cache.py (the staging-cache protocol
between stager and reader), metrics.py (the Prometheus figures pack and stage serve).
May import: format.
"""
