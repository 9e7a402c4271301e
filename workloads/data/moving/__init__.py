"""Moving datasets: between local disk and object storage, and onto a node's NVMe.

s3.py (URIs, client, retries), upload.py, stage.py + mixture_stage.py (the stager), cache.py (the staging-cache
protocol between stager and reader), metrics.py (the Prometheus figures pack and stage serve).
May import: format.
"""
