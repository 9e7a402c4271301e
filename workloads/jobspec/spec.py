"""The training Job spec: constants shared by the renderer, field validators and the pydantic models."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic.alias_generators import to_camel

from workloads.jobspec.checkpointing import SaveShares
from workloads.k8snames import DnsLabel, DnsSubdomain, is_dns1035_label, is_label_value
from workloads.quantity import (
    format_bytes,
    format_millicores,
    parse_quantity,
    quantity_bytes,
)

# The training entrypoint exits with this code on a configuration error (bad arguments, missing dataset
# manifest, unreadable config). The Job's podFailurePolicy fails the whole Job at once on it instead of
# retrying a run that can never succeed. The trainer exits with DISRUPTION_EXIT_CODE when it was stopped from
# outside (SIGTERM: after a last checkpoint) or lost a peer rank: the Job retries that without counting it. Any other
# non-zero exit counts against backoffLimit.
CONFIG_ERROR_EXIT_CODE = 42
DISRUPTION_EXIT_CODE = 43
# SIGTERM -> the pod is killed: the trainer finishes the step in flight, the ranks agree, rank 0 serialises and writes
# the checkpoint, then uploads it to the mirror. terminationGracePeriodSeconds = STOP_BASE_S (the step in flight and
# serialising; a step over a minute needs an explicit terminationGracePeriodSeconds) + the checkpoint's size over its
# write rate, twice when it is also mirrored (local write, then upload), rounded up. The trainer's "checkpoint" events
# report bytes, write_seconds and mirror_seconds: the measured rate of a real run goes into checkpoint.writeRate.
STOP_BASE_S = 60
DEFAULT_CHECKPOINT_WRITE_RATE = "100Mi"  # bytes/s: conservative for EFS elastic throughput and one S3 upload
DEFAULT_CHECKPOINT_SIZE = "1Gi"  # a ResNet-50 with SGD momentum is ~200 MB; say 1Gi when the spec does not
STOP_MARGIN_S = 5  # torchrun's agent SIGKILLs its workers this long before the kubelet would, and exits 43 itself
# A gang's ranks wait at most this long in one collective for a lost peer (NCCL's own default in PyTorch 2.x);
# then they exit with the disruption code and the whole gang restarts.
DEFAULT_COLLECTIVE_TIMEOUT_S = 600
# torchrun restarts a pod's workers this often on a rank failure (every agent of the gang follows: one re-formed
# rendezvous) before the pod itself exits; and waits this long for every node at a re-formed rendezvous. 0 by default:
# the chaos harness (benchmarks/chaos_gang.py) measured the in-place path stalling on a lost node (a survivor's
# re-formed rendezvous waited 60 s on a replacement that joined another round: 82 s to resume) where every pod
# exiting and being replaced resumed in 5-11 s. A spec on stable nodes may ask for in-place restarts.
DEFAULT_RANK_RESTARTS = 0
RENDEZVOUS_JOIN_TIMEOUT_S = 900
# Elastic gangs (minNodes): a re-forming gang waits this long, once minNodes have joined, for the rest (torch's c10d
# rendezvous `last_call_timeout`), then trains on the nodes it has; a pod that comes later grows the gang back.
DEFAULT_ELASTIC_WAIT_S = 600
# A pod on a node that stopped answering (kernel panic, lost instance) is evicted after this long (the default is
# 300 s), so the Job controller replaces it and the gang re-forms sooner.
NODE_LOST_TOLERATION_S = 60
DECODED_MOUNT = "/decoded"  # the decode cache's emptyDir in the trainer (workloads/data/reading/decode_cache.py)
CACHE_START_TIMEOUT_S = 600  # how long the trainer waits for the staging sidecar's manifest and first shards

TRAIN_CONTAINER = "train"
STAGE_CONTAINER = "stage"
RENDEZVOUS_PORT = 29500
# Prometheus endpoints (workloads/train/metrics.py, workloads/data/moving/metrics.py). torchrun starts one trainer
# process per GPU; each serves TRAIN_METRICS_PORT + its local rank, so every rank is scraped on its own port.
TRAIN_METRICS_PORT = 9450
STAGE_METRICS_PORT = 9449
STAGE_METRICS_PORT_NAME = "metrics-stage"


def train_metrics_port_name(local_rank: int) -> str:
    """IANA service names (at most 15 characters): metrics-r0 ... metrics-r99."""
    return f"metrics-r{local_rank}"


def metrics_ports(max_processes_per_pod: int) -> tuple[int, ...]:
    """Every port a training pod may serve metrics on (the stager's, then one per local rank)."""
    return (STAGE_METRICS_PORT, *range(TRAIN_METRICS_PORT, TRAIN_METRICS_PORT + max(1, max_processes_per_pod)))


# The training image's non-root user (workloads/Dockerfile). High and fixed, so it matches no user of the
# node (uids below 10000 are where distributions and admins put theirs).
RUN_AS_UID = 10001
# The root filesystem is read-only; these are the only writable places besides the data and checkpoint mounts.
TMP_DIR = "/tmp"
GIB = 2**30
HASH_LENGTH = 8
MAX_NAME_LENGTH = 63  # a Job name is also a label value and, for Indexed Jobs, the start of pod hostnames
DEFAULT_SHM_PER_GPU = 2 * GIB  # DataLoader workers pass batches through /dev/shm; 64 MiB default bus-errors
MIN_SHM = 1 * GIB
STAGING_HEADROOM_FRACTION = 0.10  # file-system overhead, partial downloads, the cache's state files
MIN_STAGING_HEADROOM = 2 * GIB
# The stager's own requests == limits (the pod stays Guaranteed). A native sidecar (cache, rolling) adds them to the
# pod's requests, so sidecar Jobs sized from pool defaults leave this much room beside the trainer.
STAGER_CPU_MILLICORES = 2000
STAGER_MEMORY = 2 * GIB
STAGER_EPHEMERAL = 1 * GIB  # its logs; the staged shards are in the dataset emptyDir, in the trainer's limit
STAGER_RESOURCES = {"cpu": format_millicores(STAGER_CPU_MILLICORES), "memory": format_bytes(STAGER_MEMORY),
                    "ephemeral-storage": format_bytes(STAGER_EPHEMERAL)}

_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # the OCI distribution spec's tag grammar
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?$")
_SECRETISH_ENV = re.compile(r"(SECRET|PASSWORD|TOKEN|PRIVATE_KEY|API_KEY|CREDENTIAL)", re.IGNORECASE)
# Set by the renderer; a spec may not override them.
_RESERVED_ENV = frozenset(
    {
        "DATA_DIR",
        "DATA_STAGING",
        "DATA_MIXTURE",
        "CHECKPOINT_DIR",
        "CHECKPOINT_URI",
        "CONFIG_ERROR_EXIT_CODE",
        "DISRUPTION_EXIT_CODE",
        "COLLECTIVE_TIMEOUT_SECONDS",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "PET_MAX_RESTARTS",
        "PET_RDZV_CONF",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_RDZV_BACKEND",
        "PET_RDZV_ENDPOINT",
        "PET_RDZV_ID",
        "PET_STANDALONE",
        "AWS_REGION",
        "HOME",
    }
)


class JobSpecError(ValueError):
    """A spec that cannot be rendered; `path` is the dotted field path (camelCase, as written in YAML)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.reason = message


# ----------------------------------------------------------------------------------------------------
# The spec


def _job_name(value: str) -> str:
    # DNS-1035: also valid as the multi-node Service name; its length is checked with the hash's (below)
    if not is_dns1035_label(value, max_length=None):
        raise ValueError(
            f"{value!r} must start with a letter and hold only lower-case letters, digits and '-'"
        )
    return value


def _label_value(value: str) -> str:
    if not is_label_value(value):
        raise ValueError(f"{value!r} is not a valid label value (at most 63 of [A-Za-z0-9-_.])")
    return value


def _number_as_text(value: Any) -> Any:
    """YAML `cpu: 4` arrives as an int; quantities are kept as text."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _positive_quantity(value: str) -> str:
    if parse_quantity(value) <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return value


def _absolute_path(value: str) -> str:
    if not value.startswith("/") or value == "/" or "//" in value or ".." in value.split("/"):
        raise ValueError(f"{value!r} must be an absolute path below / (no '..', no '//')")
    return value.rstrip("/")


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    if value in _RESERVED_ENV:
        raise ValueError(f"{value!r} is set by the renderer and cannot be overridden")
    return value


def _image(value: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{value!r} is not a container image reference")
    return value


def _image_tag(value: str) -> str:
    if not _IMAGE_TAG.match(value):
        raise ValueError(f"{value!r} is not an image tag (letters, digits, '_', '.', '-'; at most 128; no leading "
                         "'.' or '-')")
    return value


def _object_prefix(value: str) -> str:
    parts = value.split("/")
    if value.startswith("/") or any(part in (".", "..") for part in parts) or "//" in value:
        raise ValueError(f"{value!r} is not an object prefix (relative, no '.', '..' or empty parts)")
    return value


JobName = Annotated[str, AfterValidator(_job_name)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
PositiveQuantity = Annotated[str, BeforeValidator(_number_as_text), AfterValidator(_positive_quantity)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
Image = Annotated[str, AfterValidator(_image)]
ObjectPrefix = Annotated[str, AfterValidator(_object_prefix)]
ImageTag = Annotated[str, AfterValidator(_image_tag)]
# none: read the source in place (a PVC). From an object store: cache (the stager runs beside the trainer and keeps
# at most stagedSize of shards, fetched in the order the trainer will read them), copy (everything downloaded before
# the trainer starts). rolling: the name older Jobs gave a cache with a budget smaller than the dataset.
Staging = Literal["none", "cache", "copy", "rolling"]
SIDECAR_STAGING = frozenset({"cache", "rolling"})


class _Spec(BaseModel):
    """Unknown keys are errors; YAML keys are camelCase (snake_case accepted from Python)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(_Spec):
    """An environment value read from a Kubernetes Secret, so it never appears in a manifest or plan."""

    secret: DnsSubdomain = Field(description="the Secret's name, in the Job's namespace")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="the key in the Secret whose value the variable gets",
    )


class RamDiskSpec(_Spec):
    size: PositiveQuantity = Field(description="the RAM disk's sizeLimit")
    mount_path: AbsolutePath = Field(
        default="/ramdisk",
        description="where the RAM disk is mounted in the training container",
    )


def _one_source(uri: str | None, bucket: str | None, claim_name: str | None, prefix: str) -> None:
    if sum(source is not None for source in (uri, bucket, claim_name)) != 1:
        raise JobSpecError("uri", "set exactly one of bucket (+ prefix: one of the stack's buckets), uri "
                                  "(s3://bucket/prefix) and claimName (a PVC)")
    if prefix and bucket is None:
        raise JobSpecError("prefix", "only meaningful with bucket")


class MixtureSourceSpec(_Spec):
    """One source of a dataset mixture (read with workloads.data.mixed.MixedData.from_env in your own command): a
    packed dataset in object storage and its share of each epoch (one of weight, samples, repeat; none: weight 1)."""

    uri: str = Field(description="s3://bucket/prefix of the packed dataset")
    weight: float | None = Field(default=None, gt=0, description="its share, in proportion to the other weights")
    samples: int | None = Field(default=None, ge=1, description="a fixed number of its samples per epoch")
    repeat: float | None = Field(default=None, gt=0, description="its samples per epoch as a multiple of its size")
    cap: int | None = Field(default=None, ge=1, description="at most this many of its samples per epoch")

    @model_validator(mode="after")
    def _check(self) -> MixtureSourceSpec:
        if not _S3_URI.match(self.uri):
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

    uri: str | None = Field(
        default=None,
        description="s3://bucket/prefix of the packed dataset (S3, or the stack's S3-compatible store)",
    )
    bucket: DnsLabel | None = Field(
        default=None,
        description="one of the stack's buckets by its logical name (storage.buckets or storage.cos.buckets)",
    )
    prefix: ObjectPrefix = Field(default="", description="with bucket: the key prefix of the packed dataset in it")
    claim_name: DnsSubdomain | None = Field(
        default=None,
        description="a PersistentVolumeClaim in the Job's namespace holding the dataset",
    )
    mount_path: AbsolutePath = Field(
        default="/data",
        description="where the training container finds the dataset (DATA_DIR)",
    )
    staging: Staging = Field(
        default="none",
        description=("none: read the claim in place; copy: stage everything onto NVMe before training; cache: a "
                     "sidecar stager fetches shards onto NVMe while training, within stagedSize; rolling: the same as "
                     "cache, kept for older Jobs"),
    )
    staged_size: PositiveQuantity | None = Field(
        default=None,
        description="what staging keeps on the node's NVMe: the dataset's size for copy, the cache's budget for cache",
    )
    decoded_size: PositiveQuantity | None = Field(
        default=None,
        description="with staging: room on the NVMe for decoded samples of an encoded dataset (the decode cache)",
    )
    stager_workers: int = Field(default=16, ge=1, le=256, description="parallel ranged GETs of the stager")
    mixture: list[MixtureSourceSpec] | None = Field(
        default=None, min_length=2,
        description=("instead of one source: packed datasets read as a mixture (MixedData.from_env), staged by one "
                     "stager into mountPath/0, /1, ... within one stagedSize"),
    )

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.mixture is not None:
            if self.uri is not None or self.bucket is not None or self.claim_name is not None:
                raise JobSpecError("mixture", "a mixture lists its sources' uris: no uri, bucket or claimName beside")
            if self.staging == "none":
                raise JobSpecError("staging", "none with a mixture: its sources are staged (cache or copy)")
        else:
            _one_source(self.uri, self.bucket, self.claim_name, self.prefix)
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

    uri: str | None = Field(
        default=None,
        description="s3://bucket/prefix the trainer uploads checkpoints to and resumes from",
    )
    bucket: DnsLabel | None = Field(
        default=None,
        description="one of the stack's buckets by its logical name (storage.buckets or storage.cos.buckets)",
    )
    prefix: ObjectPrefix = Field(default="", description="with bucket: the key prefix for this run's checkpoints")
    claim_name: DnsSubdomain | None = Field(
        default=None,
        description="a PersistentVolumeClaim for checkpoints (EFS: rename works), mounted read-write",
    )
    mount_path: AbsolutePath = Field(default="/checkpoints", description="where a claim is mounted (CHECKPOINT_DIR)")
    size: PositiveQuantity = Field(
        default=DEFAULT_CHECKPOINT_SIZE,
        description=("The checkpoint's size, and how fast it is written (bytes per second; the trainer's "
                     "\"checkpoint\" events report bytes and seconds): they size terminationGracePeriodSeconds."),
    )
    write_rate: PositiveQuantity = Field(
        default=DEFAULT_CHECKPOINT_WRITE_RATE,
        description="how fast a checkpoint is written, per second; with size it sizes terminationGracePeriodSeconds",
    )
    sharded: bool = Field(
        default=False,
        description="every rank saves its own shards (workloads.train.sharded: size / ranks each) to the node's local "
                    "tier, then each node copies its shards to uri or bucket at writeRate",
    )
    local_write_rate: PositiveQuantity | None = Field(
        default=None,
        description="sharded: the local tier's measured write rate per node, per second (scripts/bench_checkpoint.py "
                    "local MiB/s); default writeRate",
    )

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        _one_source(self.uri, self.bucket, self.claim_name, self.prefix)
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        return self


class TolerationSpec(_Spec):
    key: Annotated[str, Field(min_length=1, max_length=316)] | None = Field(
        default=None,
        description="the taint key; unset with operator Exists: every taint",
    )
    operator: Literal["Equal", "Exists"] = Field(
        default="Equal",
        description="Equal: the taint's value must match value; Exists: any value",
    )
    value: LabelValue | None = Field(default=None, description="the taint value (operator Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None,
        description="the taint effect tolerated; unset: every effect",
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0,
        description="NoExecute only: how long the pod stays on a node after the taint appears",
    )

    @model_validator(mode="after")
    def _check(self) -> TolerationSpec:
        if self.operator == "Exists" and self.value is not None:
            raise JobSpecError("value", "operator Exists takes no value")
        if self.key is None and self.operator != "Exists":
            raise JobSpecError("key", "an empty key needs operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise JobSpecError("tolerationSeconds", "applies only to effect NoExecute")
        return self


class TrainingJobSpec(_Spec):
    """One training run. Resource fields are per pod (one pod per node)."""

    name: JobName = Field(
        description=("the Job's name (DNS label); the rendered Job is <name>-<hash of the spec>, so a changed spec is "
                     "a new Job"),
    )
    kind: str = Field(
        default="Job",
        description=("the controller that runs the gang, a row of the kind table (workloads/jobspec/kinds.py): Job, "
                     "a batch/v1 Indexed Job (no controller to install); JobSet, one failure budget per gang "
                     "(jobControllers.jobset); TrainJob, Kubeflow Trainer on a TrainingRuntime of the same pod "
                     "(jobControllers.trainer)"),
    )
    image: Image | None = Field(
        default=None,
        description=("Either a full image reference, or a tag of the stack's own registry "
                     "(ClusterFacts.image_repository)."),
    )
    image_tag: ImageTag | None = Field(
        default=None,
        description="a tag of the stack's own registry (jobFacts.image_repository); the Job runs <repository>:<tag>",
    )
    command: list[str] | None = Field(
        default=None, min_length=1,
        description=("the container's command, run inside the launcher (see launcher); unset: the image's entrypoint "
                     "(the bundled trainer), under the launcher for several GPUs or nodes. With a command, no trainer "
                     "argument (--data, --resume, ...) is implied"),
    )
    launcher: Literal["torchrun", "none"] = Field(
        default="torchrun",
        description=("how the pod runs your command: torchrun, inside the in-process torchrun wrapper (python -m "
                     "workloads.train.launch, from the training image; one process per GPU, a c10d rendezvous across "
                     "nodes), so the pod's exit code tells a config error (42) from a disruption (43) from a crash; "
                     "none: the command as written (your own launcher: a lost peer or a SIGTERM is then counted "
                     "against backoffLimit, and the plan notes it). Only with command"),
    )
    args: list[str] = Field(
        default_factory=list,
        description=("the container's arguments; with the bundled trainer, after the data and checkpoint paths the "
                     "renderer implies"),
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="environment variables of the training container (plain values; secrets go in secretEnv)",
    )
    secret_env: dict[EnvName, SecretKeyRef] = Field(
        default_factory=dict,
        description="environment variables read from Kubernetes Secrets, by variable name",
    )
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs per pod (nvidia.com/gpu); 0: a CPU Job")
    gpu_type: DnsLabel | None = Field(
        default=None,
        description="the pools' GPU type to run on (a10g, h100, ...); required when the stack has several",
    )
    cpu: PositiveQuantity | None = Field(
        default=None,
        description="default: the pool's per-GPU CPU x gpus",
    )
    memory: PositiveQuantity | None = Field(
        default=None,
        description="the container's memory limit; default: pool's per-GPU memory x gpus",
    )
    process_memory: PositiveQuantity = Field(
        default="4Gi",
        description="what the process needs besides memory-backed volumes",
    )
    ephemeral_storage: PositiveQuantity = Field(
        default="10Gi",
        description="local scratch besides staging: logs and /tmp (its sizeLimit)",
    )
    shm_size: PositiveQuantity | None = Field(
        default=None,
        description="/dev/shm; default max(1Gi, 2Gi x gpus)",
    )
    ram_disk: RamDiskSpec | None = Field(
        default=None,
        description="a memory-backed emptyDir for fast scratch, counted in the memory limit",
    )
    dataset: DatasetSpec | None = Field(
        default=None,
        description="the training data: its source and how it is staged onto the node",
    )
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        description="where checkpoints go: a PVC or an object-store prefix",
    )
    nodes: int = Field(
        default=1, ge=1, le=512,
        description=("pods (one per node; with minNodes, the most); above 1 an Indexed Job with a headless Service and "
                     "torchrun rendezvous"),
    )
    backoff_limit: int = Field(
        default=2, ge=0, le=100,
        description="failed pods the Job may retry (disruptions such as a Spot reclaim do not count)",
    )
    active_deadline_seconds: int = Field(
        default=3 * 86400, ge=60,
        description="the longest the Job may run, retries included; then it fails",
    )
    termination_grace_period_seconds: int | None = Field(
        default=None, ge=30, le=3600,
        description=("Time from SIGTERM to SIGKILL, for the last checkpoint; unset: 60 s plus checkpoint.size over "
                     "checkpoint.writeRate (twice when the checkpoint is also uploaded), 60 s without a checkpoint."),
    )
    collective_timeout_seconds: int = Field(
        default=DEFAULT_COLLECTIVE_TIMEOUT_S, ge=60, le=7200,
        description=("Multi-node: the longest a rank waits in a collective for a lost peer; then it exits and the "
                     "whole gang restarts."),
    )
    rank_restarts: int = Field(
        default=DEFAULT_RANK_RESTARTS, ge=0, le=100,
        description=("Multi-node: torchrun's in-place restarts of a pod's workers before the pod exits (0: it exits "
                     "and is replaced)."),
    )
    min_nodes: int | None = Field(
        default=None, ge=1, le=512,
        description=("Multi-node, elastic: the gang may train on as few as this many nodes (nodes is the most) when "
                     "lost capacity does not come back within elasticWaitSeconds, and grows back when it does. The "
                     "bundled trainer then needs --global-batch-size in args (divisible by every possible world "
                     "size): the global batch, the epoch order and the learning rate stay as they are. None: always "
                     "all nodes."),
    )
    elastic_wait_seconds: int = Field(
        default=DEFAULT_ELASTIC_WAIT_S, ge=30, le=RENDEZVOUS_JOIN_TIMEOUT_S - 60,
        description=("Multi-node, elastic: how long a re-forming gang waits for missing nodes once minNodes have "
                     "joined."),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=7 * 86400, ge=0,
        description="deletes the finished Job (and its pods) after this long; null keeps it",
    )
    priority_class: DnsSubdomain | None = Field(
        default=None,
        description="the pods' Kubernetes PriorityClass (priorityClassName)",
    )
    queue: DnsSubdomain | None = Field(
        default=None,
        description=("Kueue LocalQueue: the whole gang is admitted together. None: the stack's default LocalQueue "
                     "when it runs Kueue."),
    )
    team: DnsLabel | None = Field(
        default=None,
        description=("A stack team with a namespace (ml-cluster:kueue.teams): the Job runs there, through the "
                     "team's LocalQueue, as the team's service account, and may name only the team's bucket "
                     "prefixes. None: the training namespace."),
    )
    workload_priority: DnsSubdomain | None = Field(
        default=None,
        description="a Kueue WorkloadPriorityClass: order in the queue, preemption",
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description="An image that writes outside /tmp, the RAM disk and its mounts can opt out of the read-only root.",
    )
    suspend: bool | None = Field(
        default=None,
        description=("Created suspended (spec.suspend) and started later, e.g. once its dataset is uploaded. None: "
                     "the caller's default, which is suspended for the Jobs a stack deploys and running for "
                     "`workloads.submit`."),
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list,
        description="tolerations beside the GPU taint's, e.g. for a pool's own taints",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingJobSpec:
        if (self.image is None) == (self.image_tag is None):
            raise JobSpecError("image", "set exactly one of image (a full reference) and imageTag (a tag of the "
                                        "stack's registry)")
        budget = MAX_NAME_LENGTH - 1 - HASH_LENGTH
        if self.nodes > 1:  # Indexed Job pods are named <job>-<index>: the hostname is a DNS label too
            budget -= 1 + len(str(self.nodes - 1))
        if len(self.name) > budget:
            raise JobSpecError(
                "name",
                f"{self.name!r} is {len(self.name)} characters; at most {budget} fit with the "
                f"-<hash> suffix{' and the pod index' if self.nodes > 1 else ''}",
            )
        for env_name in self.env:
            if _SECRETISH_ENV.search(env_name):
                raise JobSpecError(
                    f"env.{env_name}", "looks like a secret: put it in a Secret and use secretEnv"
                )
        clash = sorted(set(self.env) & set(self.secret_env))
        if clash:
            raise JobSpecError(f"secretEnv.{clash[0]}", "also set in env")
        self._check_elastic()
        if self.launcher == "none" and self.command is None:
            raise JobSpecError("launcher", "none runs your own command as written: set command too (the bundled "
                                           "trainer always runs under the launcher)")
        if self.dataset is not None and self.dataset.mixture is not None and self.command is None:
            raise JobSpecError("dataset.mixture", "the bundled trainer reads one dataset: read a mixture with "
                                                  "workloads.data.mixed.MixedData.from_env in your own command")
        if self.gpu_type is not None and self.gpus == 0:
            raise JobSpecError("gpuType", f"{self.gpu_type} with gpus 0: a CPU job cannot select a GPU type")
        mounts = {"/dev/shm": "/dev/shm"}
        if self.dataset is not None and self.dataset.decoded_size is not None:
            mounts["the decode cache"] = DECODED_MOUNT
        for field_name, mount in (
            ("ramDisk.mountPath", self.ram_disk.mount_path if self.ram_disk else None),
            ("dataset.mountPath", self.dataset.mount_path if self.dataset else None),
            ("checkpoint.mountPath", self.checkpoint.mount_path if self.checkpoint else None),
        ):
            if mount is None:
                continue
            for other_field, other in mounts.items():
                if mount == other or mount.startswith(other + "/") or other.startswith(mount + "/"):
                    raise JobSpecError(field_name, f"{mount} overlaps {other_field} {other}")
            mounts[field_name] = mount
        if self.memory is not None:
            shortfall = memory_shortfall(quantity_bytes(self.memory), self)
            if shortfall:
                raise JobSpecError("memory", shortfall)
        self._check_save_window()
        return self

    def _check_save_window(self) -> None:
        """A sharded checkpoint that cannot be saved within the set grace period is a config error: every stop
        (Spot notice, drain, block end) would lose the work since the previous one."""
        grace = self.termination_grace_period_seconds
        if grace is None or self.checkpoint is None or not self.checkpoint.sharded:
            return
        needed = STOP_BASE_S + math.ceil(self.checkpoint_save_seconds())
        if grace < needed:
            raise JobSpecError("terminationGracePeriodSeconds", f"{grace} s cannot save the sharded checkpoint: "
                               f"{self._save_shares().reason()}, {needed} s with the {STOP_BASE_S} s stop base")

    def _check_elastic(self) -> None:
        if self.min_nodes is None:
            if "elastic_wait_seconds" in self.model_fields_set:
                raise JobSpecError("elasticWaitSeconds", "only an elastic gang waits for its missing nodes: set "
                                                         "minNodes too")
            return
        if self.nodes < 2:
            raise JobSpecError("minNodes", "an elastic gang needs nodes >= 2 (nodes is its largest size)")
        if self.min_nodes > self.nodes:
            raise JobSpecError("minNodes", f"{self.min_nodes} is more than nodes ({self.nodes})")
        if self.command is not None or self.min_nodes == self.nodes:
            return  # your own trainer keeps its own batch rule
        global_batch = _option_value(self.args, "--global-batch-size")
        if global_batch is None or not global_batch.isdigit() or int(global_batch) <= 0:
            raise JobSpecError("args", "an elastic gang (minNodes) of the bundled trainer needs --global-batch-size N "
                                       "in args: the global batch, the epoch order and the learning rate then stay "
                                       "the same on fewer nodes")
        per_node = max(self.gpus, 1)
        for nodes in range(self.min_nodes, self.nodes + 1):
            if int(global_batch) % (nodes * per_node):
                raise JobSpecError("args", f"--global-batch-size {global_batch} is not divisible by {nodes} nodes x "
                                           f"{per_node} processes, a size the elastic gang (minNodes "
                                           f"{self.min_nodes}..nodes {self.nodes}) may run at")

    def is_gang(self) -> bool:
        """Several processes: several nodes, or several GPUs in the pod (one process per GPU, under torchrun)."""
        return self.nodes > 1 or self.gpus > 1

    def under_launcher(self) -> bool:
        """The pod runs torchrun in-process (workloads/train/launch.py): your command unless `launcher: none`, and
        the bundled trainer when it is a gang (alone it speaks the exit codes itself)."""
        return self.launcher != "none" if self.command is not None else self.is_gang()

    def is_elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nodes

    # Derived sizes (bytes) the renderer and the tests share.
    def shm_bytes(self) -> int:
        if self.shm_size is not None:
            return quantity_bytes(self.shm_size)
        return max(MIN_SHM, DEFAULT_SHM_PER_GPU * self.gpus)

    def ram_disk_bytes(self) -> int:
        return quantity_bytes(self.ram_disk.size) if self.ram_disk else 0

    def memory_backed_bytes(self) -> int:
        return self.shm_bytes() + self.ram_disk_bytes()

    def staged_bytes(self) -> int:
        """Local NVMe the staging emptyDir may fill (staged size plus headroom); 0 without staging."""
        if self.dataset is None or self.dataset.staged_size is None:
            return 0
        return _with_headroom(quantity_bytes(self.dataset.staged_size))

    def decoded_bytes(self) -> int:
        """Local NVMe the decode cache's emptyDir may fill (its budget plus headroom: processes that open a shard's
        file at once may each pass the budget check); 0 without one."""
        if self.dataset is None or self.dataset.decoded_size is None:
            return 0
        return _with_headroom(quantity_bytes(self.dataset.decoded_size))

    def is_staged(self) -> bool:
        return self.dataset is not None and self.dataset.staging != "none"

    def grace_seconds(self) -> int:
        """terminationGracePeriodSeconds: the spec's, else STOP_BASE_S plus the checkpoint's write (and mirror)."""
        if self.termination_grace_period_seconds is not None:
            return self.termination_grace_period_seconds
        if self.checkpoint is None:
            return STOP_BASE_S
        return STOP_BASE_S + math.ceil(self.checkpoint_save_seconds())

    def _save_shares(self) -> SaveShares:
        assert self.checkpoint is not None
        local = self.checkpoint.local_write_rate
        rate = quantity_bytes(self.checkpoint.write_rate)
        return SaveShares(size=quantity_bytes(self.checkpoint.size), nodes=self.nodes, ranks_per_node=max(1, self.gpus),
                          local_rate=quantity_bytes(local) if local else rate, remote_rate=rate,
                          mirrored=self.checkpoint.uri is not None or self.checkpoint.bucket is not None)

    def checkpoint_save_seconds(self) -> float:
        """How long the stop path's last checkpoint takes. Whole (rank 0): size over writeRate, twice when it is
        also mirrored. Sharded: each node's shards over the local tier's rate, then over writeRate to the remote
        tier (workloads/jobspec/checkpointing.py)."""
        assert self.checkpoint is not None
        if self.checkpoint.sharded:
            return self._save_shares().seconds
        writes = 2 if self.checkpoint.uri is not None or self.checkpoint.bucket is not None else 1
        return writes * quantity_bytes(self.checkpoint.size) / quantity_bytes(self.checkpoint.write_rate)


def _option_value(args: list[str], option: str) -> str | None:
    """The value of `option` in an argument list (`--opt V` or `--opt=V`); the last one wins, as in argparse."""
    found = None
    for number, arg in enumerate(args):
        if arg == option and number + 1 < len(args):
            found = args[number + 1]
        elif arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
    return found


def _with_headroom(num_bytes: int) -> int:
    headroom = max(MIN_STAGING_HEADROOM, math.ceil(num_bytes * STAGING_HEADROOM_FRACTION))
    return _round_up_gib(num_bytes + headroom)


def _round_up_gib(num_bytes: int) -> int:
    return -(-num_bytes // GIB) * GIB


def memory_shortfall(limit: int, spec: TrainingJobSpec) -> str | None:
    """Why `limit` cannot hold the process plus every memory-backed volume with numbers; None if it can."""
    needed = quantity_bytes(spec.process_memory) + spec.memory_backed_bytes()
    if limit >= needed:
        return None
    parts = [
        f"process memory {format_bytes(quantity_bytes(spec.process_memory))}",
        f"/dev/shm {format_bytes(spec.shm_bytes())}",
    ]
    if spec.ram_disk:
        parts.append(f"ramDisk {format_bytes(spec.ram_disk_bytes())}")
    return (
        f"limit {format_bytes(limit)} does not cover {' + '.join(parts)} = {format_bytes(needed)} "
        "(memory-backed emptyDirs count against the container's memory limit)"
    )
