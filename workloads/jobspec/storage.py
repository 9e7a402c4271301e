"""Where a Job's data lives and where its checkpoints go: the dataset (one source or a mixture, and how it is staged
onto the node) and the checkpoint location models of the Job spec."""

from __future__ import annotations

from pydantic import Field, model_validator

from workloads.jobspec.fields import (
    _S3_URI,
    DEFAULT_CHECKPOINT_SIZE,
    DEFAULT_CHECKPOINT_WRITE_RATE,
    SIDECAR_STAGING,
    AbsolutePath,
    JobSpecError,
    ObjectPrefix,
    PositiveQuantity,
    Staging,
    _Spec,
)
from workloads.k8snames import DnsLabel, DnsSubdomain
from workloads.quantity import quantity_bytes


def _one_source(uri: str | None, bucket: str | None, claim_name: str | None, prefix: str) -> None:
    if sum(source is not None for source in (uri, bucket, claim_name)) != 1:
        raise JobSpecError("uri", "set exactly one of bucket (+ prefix: one of the stack's buckets), uri "
                                  "(s3://bucket/prefix) and claimName (a PVC)")
    if prefix and bucket is None:
        raise JobSpecError("prefix", "only meaningful with bucket")


class MixtureSourceSpec(_Spec):
    """One source of a dataset mixture (read with workloads.data.mixed.MixedData.from_env in your own command): a
    packed dataset in object storage, by `uri` or by `bucket` + `prefix` (a team's Job names its sources so, as its
    dataset), and its share of each epoch (one of weight, samples, repeat; none: weight 1)."""

    uri: str | None = None
    """s3://bucket/prefix of the packed dataset"""
    bucket: DnsLabel | None = None
    """instead of uri: one of the stack's buckets by its logical name (storage.buckets or storage.cos.buckets)"""
    prefix: ObjectPrefix = ""
    """with bucket: the key prefix of the packed dataset in it"""
    weight: float | None = Field(default=None, gt=0)
    """its share, in proportion to the other weights"""
    samples: int | None = Field(default=None, ge=1)
    """a fixed number of its samples per epoch"""
    repeat: float | None = Field(default=None, gt=0)
    """its samples per epoch as a multiple of its size"""
    cap: int | None = Field(default=None, ge=1)
    """at most this many of its samples per epoch"""

    @model_validator(mode="after")
    def _check(self) -> MixtureSourceSpec:
        if (self.uri is None) == (self.bucket is None):
            raise JobSpecError("uri", "set exactly one of uri (s3://bucket/prefix) and bucket (+ prefix: one of the "
                                      "stack's buckets)")
        if self.prefix and self.bucket is None:
            raise JobSpecError("prefix", "only meaningful with bucket")
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        given = [name for name in ("weight", "samples", "repeat") if getattr(self, name) is not None]
        if len(given) > 1:
            raise JobSpecError(given[1], f"give one of weight, samples, repeat, not {' and '.join(given)}")
        return self


class DatasetSpec(_Spec):
    """Where the training data lives and how it reaches the GPU node.

    Exactly one source: `bucket` + `prefix` (one of the stack's own buckets by its logical name, so the spec
    holds no account-specific bucket name), `uri` (s3://bucket/prefix on S3, or on the stack's S3-compatible
    store such as IBM COS) or `claimName` (a PVC in the Job's namespace: the EFS class, a Mountpoint S3 PV, a
    COS volume).
    `stagedSize` is what staging keeps on local NVMe, and sizes the pod's NVMe: the whole dataset for `copy`; for
    `cache` (and `rolling`) the stager's budget, the dataset's size to keep all of it or less to bound the cache.
    `decodedSize` (with staging) keeps an encoded dataset's decoded samples on the same NVMe, up to that size, so
    each JPEG is decoded once and later epochs read pixels (the trainer's --decode-cache; size x size x 3 bytes a
    sample holds all of them).
    """

    uri: str | None = None
    """s3://bucket/prefix of the packed dataset (S3, or the stack's S3-compatible store)"""
    bucket: DnsLabel | None = None
    """one of the stack's buckets by its logical name (storage.buckets or storage.cos.buckets)"""
    prefix: ObjectPrefix = ""
    """with bucket: the key prefix of the packed dataset in it"""
    claim_name: DnsSubdomain | None = None
    """a PersistentVolumeClaim in the Job's namespace holding the dataset"""
    sub_path: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?$")
    ("with claimName: the directory inside the claim that holds the dataset (a volume subPath), e.g. "
     "datasets/imagenet-hdf5 on the FSx for Lustre claim; default: the claim's root")
    mount_path: AbsolutePath = "/data"
    """where the training container finds the dataset (DATA_DIR)"""
    staging: Staging = "none"
    ("none: read the claim in place; copy: stage everything onto NVMe before training; cache: a sidecar stager "
     "fetches shards onto NVMe while training, within stagedSize; rolling: the same as cache, kept for older Jobs")
    staged_size: PositiveQuantity | None = None
    """what staging keeps on the node's NVMe: the dataset's size for copy, the cache's budget for cache"""
    decoded_size: PositiveQuantity | None = None
    """with staging: room on the NVMe for decoded samples of an encoded dataset (the decode cache)"""
    stager_workers: int = Field(default=16, ge=1, le=256)
    """parallel ranged GETs of the stager"""
    mixture: list[MixtureSourceSpec] | None = Field(default=None, min_length=2)
    ("instead of one source: packed datasets read as a mixture (MixedData.from_env), staged by one stager into "
     "mountPath/0, /1, ... within one stagedSize")

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.mixture is not None:
            if self.uri is not None or self.bucket is not None or self.claim_name is not None:
                raise JobSpecError("mixture", "a mixture lists its sources' uris: no uri, bucket or claimName beside")
            if self.staging == "none":
                raise JobSpecError("staging", "none with a mixture: its sources are staged (cache or copy)")
        else:
            _one_source(self.uri, self.bucket, self.claim_name, self.prefix)
        if self.sub_path is not None and (self.claim_name is None
                                          or ".." in self.sub_path.split("/") or "." in self.sub_path.split("/")):
            raise JobSpecError("subPath", "a directory inside claimName (relative, no '.' or '..'): only with "
                                          "claimName")
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        source = self.uri if self.uri is not None else f"bucket {self.bucket}" if self.bucket else None
        if source is not None and self.staging == "none":
            raise JobSpecError(
                "staging",
                f"none with {source}: an object-store dataset must be staged "
                "(cache or copy), or mounted through a PVC (claimName)",
            )
        if self.claim_name is not None and self.staging in SIDECAR_STAGING:
            raise JobSpecError(
                "staging", f"{self.staging} fetches shards from object storage: it needs bucket or uri, not "
                           "claimName (staging copy copies a PVC onto NVMe)"
            )
        if self.staging in SIDECAR_STAGING and self.staged_size is None:
            raise JobSpecError(
                "stagedSize", f"required with staging {self.staging}: the stager's budget and the pod's NVMe (the "
                              "dataset's size keeps all of it, less bounds the cache)"
            )
        if self.staging in SIDECAR_STAGING and quantity_bytes(self.staged_size or "0") < 1 << 20:
            raise JobSpecError("stagedSize", f"{self.staged_size} is below 1Mi, the smallest budget the stager keeps")
        if self.staging == "copy" and self.staged_size is None:
            raise JobSpecError("stagedSize", "required with staging copy: the dataset's size, the pod's NVMe")
        if self.staging == "none" and self.staged_size is not None:
            raise JobSpecError("stagedSize", "only meaningful with staging cache, copy or rolling")
        if self.staging == "none" and self.decoded_size is not None:
            raise JobSpecError("decodedSize", "needs staging cache, copy or rolling: the decoded samples live on the "
                                              "node's NVMe beside the staged shards")
        return self

    def has_sidecar(self) -> bool:
        """The stager runs beside the trainer (a native sidecar) rather than before it (an init container)."""
        return self.staging in SIDECAR_STAGING


class CheckpointSpec(_Spec):
    """Where checkpoints go: a PVC (EFS: rename works) or an S3 prefix the trainer uploads to.

    Not a Mountpoint S3 volume: it cannot rename, which breaks write-then-rename checkpointing.
    """

    uri: str | None = None
    """s3://bucket/prefix the trainer uploads checkpoints to and resumes from"""
    bucket: DnsLabel | None = None
    """one of the stack's buckets by its logical name (storage.buckets or storage.cos.buckets)"""
    prefix: ObjectPrefix = ""
    """with bucket: the key prefix for this run's checkpoints"""
    claim_name: DnsSubdomain | None = None
    """a PersistentVolumeClaim for checkpoints (EFS: rename works), mounted read-write"""
    mount_path: AbsolutePath = "/checkpoints"
    """where a claim is mounted (CHECKPOINT_DIR)"""
    size: PositiveQuantity = DEFAULT_CHECKPOINT_SIZE
    ("The checkpoint's size, and how fast it is written (bytes per second; the trainer's "
     "\"checkpoint\" events report bytes and seconds): they size terminationGracePeriodSeconds.")
    write_rate: PositiveQuantity = DEFAULT_CHECKPOINT_WRITE_RATE
    ("how fast a checkpoint is written, per second; with size it sizes terminationGracePeriodSeconds. On a claim of "
     "the stack's FSx for Lustre: default the file system's share (its throughput over the Job's writers at once), "
     "and never more than that share")
    sharded: bool = False
    ("every rank saves its own shards (workloads.train.sharded: size / ranks each) to the node's local tier, then "
     "each node copies its shards to uri or bucket at writeRate")
    local_write_rate: PositiveQuantity | None = None
    ("sharded: the local tier's measured write rate per node, per second (scripts/bench_checkpoint.py local MiB/s); "
     "default writeRate")

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        _one_source(self.uri, self.bucket, self.claim_name, self.prefix)
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        return self
