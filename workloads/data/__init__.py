"""Dataset tools: pack image folders into HDF5 shards, verify them, upload to S3/COS, stage onto local disk.

CLI: `python -m workloads.data pack|verify|upload|stage` (see docs/data-tools.md). The on-disk contract lives in
workloads/data/format/manifest.py; the staging-cache protocol (the stager's state, the reader's plan) in
workloads/data/moving/cache.py; the epoch order in workloads/data/reading/sampler.py.
"""

TOOL_VERSION = "ml-cluster-data 0.1.0"
