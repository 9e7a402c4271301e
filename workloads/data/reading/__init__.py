"""Reading datasets: the trainer's and the public API's input pipeline.

dataset.py (HDF5 shards as a torch Dataset), records_dataset.py (typed records), sampler.py (the epoch order),
mixture.py (the epoch order of a mixture), transforms.py (per-batch augmentation), decode_cache.py (decode once per
node), shm.py (shared memory for the loader's workers).
May import: format, moving (the staging-cache reader).
"""
