"""Reading datasets: the trainer's and the public API's input pipeline.

records_dataset.py (the one reader of packed shards: typed records, and image folders through a column adapter),
dataset.py (HDF5Dataset: that reader as (images, labels); the JPEG-folder baseline; make_loader), batches.py (the
readers' errors and shared-memory batches), sampler.py (the epoch order), mixture.py (the epoch order of a mixture),
transforms.py (per-batch augmentation), decode_cache.py (decode once per node), shm.py (shared memory for the
loader's workers), workers.py (a loader worker's init: out of reach of the stop signals sent to the group).
May import: format, moving (the staging-cache reader).
"""
