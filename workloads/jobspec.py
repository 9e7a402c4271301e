"""TrainingJobSpec -> Kubernetes manifests: a typed spec and a pure renderer (dicts in, dicts out).

A spec is declared under `ml-cluster:jobs` in a stack file or as YAML under workloads/jobs/ (camelCase
keys). The renderer turns it, with the ClusterFacts of the cluster it targets, into complete manifests
(a batch/v1 Job, plus a headless Service for multi-node runs) that keep these rules:

- GPU limits equal requests (every resource does: requests == limits), the nvidia.com/gpu toleration,
  a nodeSelector for the GPU type.
- /dev/shm and the optional RAM disk are emptyDirs with medium Memory and a sizeLimit; such volumes are
  charged to the container's memory limit, so the limit must cover process memory + all of them (else
  the spec is rejected, with the numbers).
- Staging `copy`: an initContainer copies the dataset (cp -a from a PVC, or the project's stager from
  S3/COS) onto an NVMe-backed emptyDir; `rolling`: the stager runs as a native sidecar keeping a bounded
  window of shards. Either way the pod selects NVMe nodes and its ephemeral-storage covers the staged
  bytes plus headroom.
- Lifecycle: `pulumi.com/skipAwait: "true"`, the spec's hash in the Job name (a changed spec is a new
  Job, never an immutable-field error), restartPolicy Never, a podFailurePolicy that ignores disruptions
  and fails fast on CONFIG_ERROR_EXIT_CODE, ttlSecondsAfterFinished, activeDeadlineSeconds.
- Restricted security context, no hostPath; app.kubernetes.io/* labels and the stack label.
- Multi-node: an Indexed Job (completions = parallelism = nodes), a headless Service, torchrun c10d env.

No Pulumi or infra imports here: the same code runs in `workloads.submit` and inside the cluster.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from workloads.cluster_facts import ClusterFacts, PoolFacts
from workloads.quantity import (
    format_bytes,
    format_millicores,
    parse_quantity,
    quantity_bytes,
    quantity_millicores,
)

# The training entrypoint exits with this code on a configuration error (bad arguments, missing dataset
# manifest, unreadable config). The Job's podFailurePolicy fails the whole Job at once on it instead of
# retrying a run that can never succeed. Any other non-zero exit counts against backoffLimit.
CONFIG_ERROR_EXIT_CODE = 42
ROLLING_START_TIMEOUT_S = 600  # how long the trainer waits for the rolling-window sidecar's first shards

TRAIN_CONTAINER = "train"
STAGE_CONTAINER = "stage"
RENDEZVOUS_PORT = 29500
RUN_AS_UID = 1000  # the training image's non-root user (workloads/Dockerfile)
GIB = 2**30
HASH_LENGTH = 8
MAX_NAME_LENGTH = 63  # a Job name is also a label value and, for Indexed Jobs, the start of pod hostnames
DEFAULT_SHM_PER_GPU = 2 * GIB  # DataLoader workers pass batches through /dev/shm; 64 MiB default bus-errors
MIN_SHM = 1 * GIB
STAGING_HEADROOM_FRACTION = 0.10  # file-system overhead, partial downloads, the rolling window's next shard
MIN_STAGING_HEADROOM = 2 * GIB
# The stager's own requests == limits (the pod stays Guaranteed). A native sidecar (rolling) adds them to the
# pod's requests, so rolling Jobs sized from pool defaults leave this much room beside the trainer.
STAGER_CPU_MILLICORES = 2000
STAGER_MEMORY = 2 * GIB
STAGER_RESOURCES = {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "1Gi"}

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: also valid as the multi-node Service name
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?$")
_SECRETISH_ENV = re.compile(r"(SECRET|PASSWORD|TOKEN|PRIVATE_KEY|API_KEY|CREDENTIAL)", re.IGNORECASE)
# Set by the renderer; a spec may not override them.
_RESERVED_ENV = frozenset(
    {
        "DATA_DIR",
        "DATA_STAGING",
        "CHECKPOINT_DIR",
        "CHECKPOINT_URI",
        "CONFIG_ERROR_EXIT_CODE",
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


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in an argument list."""
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _job_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{value!r} must start with a letter and hold only lower-case letters, digits and '-'"
        )
    return value


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)"
        )
    return value


def _dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain")
    return value


def _label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
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


JobName = Annotated[str, AfterValidator(_job_name)]
DnsLabel = Annotated[str, AfterValidator(_dns_label)]
DnsSubdomain = Annotated[str, AfterValidator(_dns_subdomain)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
PositiveQuantity = Annotated[str, BeforeValidator(_number_as_text), AfterValidator(_positive_quantity)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
Image = Annotated[str, AfterValidator(_image)]
Staging = Literal["none", "copy", "rolling"]


class _Spec(BaseModel):
    """Unknown keys are errors; YAML keys are camelCase (snake_case accepted from Python)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(_Spec):
    """An environment value read from a Kubernetes Secret, so it never appears in a manifest or plan."""

    secret: DnsSubdomain
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]


class RamDiskSpec(_Spec):
    size: PositiveQuantity
    mount_path: AbsolutePath = "/ramdisk"


class DatasetSpec(_Spec):
    """Where the training data lives and how it reaches the GPU node.

    Exactly one source: `uri` (s3://bucket/prefix on S3, or on the stack's S3-compatible store such as IBM
    COS) or `claimName` (a PVC in the Job's namespace: the EFS class, a Mountpoint S3 PV, a COS volume).
    `stagedSize` is what staging keeps on local NVMe: the whole dataset for `copy`, the window for `rolling`.
    """

    uri: str | None = None
    claim_name: DnsSubdomain | None = None
    mount_path: AbsolutePath = "/data"
    staging: Staging = "none"
    staged_size: PositiveQuantity | None = None
    stager_workers: int = Field(default=16, ge=1, le=256)

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if (self.uri is None) == (self.claim_name is None):
            raise JobSpecError("uri", "set exactly one of uri (s3://bucket/prefix) and claimName (a PVC)")
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        if self.uri is not None and self.staging == "none":
            raise JobSpecError(
                "staging",
                f"none with uri {self.uri!r}: an object-store dataset must be staged "
                "(copy or rolling), or mounted through a PVC (claimName)",
            )
        if self.claim_name is not None and self.staging == "rolling":
            raise JobSpecError(
                "staging", "rolling streams shards from object storage: it needs uri, not claimName"
            )
        if self.staging != "none" and self.staged_size is None:
            raise JobSpecError(
                "stagedSize", f"required with staging {self.staging} (the bytes kept on local NVMe)"
            )
        if self.staging == "none" and self.staged_size is not None:
            raise JobSpecError("stagedSize", "only meaningful with staging copy or rolling")
        return self


class CheckpointSpec(_Spec):
    """Where checkpoints go: a PVC (EFS: rename works) or an S3 prefix the trainer uploads to.

    Not a Mountpoint S3 volume: it cannot rename, which breaks write-then-rename checkpointing.
    """

    uri: str | None = None
    claim_name: DnsSubdomain | None = None
    mount_path: AbsolutePath = "/checkpoints"

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        if (self.uri is None) == (self.claim_name is None):
            raise JobSpecError("uri", "set exactly one of uri (s3://bucket/prefix) and claimName (a PVC)")
        if self.uri is not None and not _S3_URI.match(self.uri):
            raise JobSpecError("uri", f"{self.uri!r} must look like s3://bucket/prefix")
        return self


class TolerationSpec(_Spec):
    key: Annotated[str, Field(min_length=1, max_length=316)] | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

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

    name: JobName
    image: Image
    command: list[str] | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[EnvName, str] = Field(default_factory=dict)
    secret_env: dict[EnvName, SecretKeyRef] = Field(default_factory=dict)
    gpus: int = Field(default=1, ge=0, le=16)
    gpu_type: DnsLabel | None = None
    cpu: PositiveQuantity | None = None  # default: the pool's per-GPU CPU x gpus
    memory: PositiveQuantity | None = (
        None  # the container's memory limit; default: pool's per-GPU memory x gpus
    )
    process_memory: PositiveQuantity = "4Gi"  # what the process needs besides memory-backed volumes
    ephemeral_storage: PositiveQuantity = "10Gi"  # local scratch besides staging (logs, writable layer, /tmp)
    shm_size: PositiveQuantity | None = None  # /dev/shm; default max(1Gi, 2Gi x gpus)
    ram_disk: RamDiskSpec | None = None
    dataset: DatasetSpec | None = None
    checkpoint: CheckpointSpec | None = None
    nodes: int = Field(default=1, ge=1, le=512)
    backoff_limit: int = Field(default=2, ge=0, le=100)
    active_deadline_seconds: int = Field(default=3 * 86400, ge=60)
    ttl_seconds_after_finished: int | None = Field(default=7 * 86400, ge=0)
    priority_class: DnsSubdomain | None = None
    queue: DnsSubdomain | None = None  # Kueue LocalQueue: the whole gang is admitted together
    tolerations: list[TolerationSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> TrainingJobSpec:
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
        if self.gpu_type is not None and self.gpus == 0:
            raise JobSpecError("gpuType", f"{self.gpu_type} with gpus 0: a CPU job cannot select a GPU type")
        if self.command is None and self.dataset is not None and self.dataset.staging == "rolling":
            epochs = _flag_value(self.args, "--epochs")
            if epochs is not None and epochs != "1":
                # The window is streamed once: consumed shards are deleted from the node to make room.
                raise JobSpecError("args", f"--epochs {epochs} with dataset.staging rolling: a rolling window "
                                           "is read once; use --epochs 1 or staging copy")
        mounts = {"/dev/shm": "/dev/shm"}
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
            shortfall = _memory_shortfall(quantity_bytes(self.memory), self)
            if shortfall:
                raise JobSpecError("memory", shortfall)
        return self

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
        staged = quantity_bytes(self.dataset.staged_size)
        headroom = max(MIN_STAGING_HEADROOM, math.ceil(staged * STAGING_HEADROOM_FRACTION))
        return _round_up_gib(staged + headroom)

    def is_staged(self) -> bool:
        return self.dataset is not None and self.dataset.staging != "none"


def _round_up_gib(num_bytes: int) -> int:
    return -(-num_bytes // GIB) * GIB


def _memory_shortfall(limit: int, spec: TrainingJobSpec) -> str | None:
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


# ----------------------------------------------------------------------------------------------------
# Loading specs


def _loc_to_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for an invalid mapping key: the key is already in the path
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def _first_error(exc: ValidationError, prefix: str = "") -> JobSpecError:
    error = exc.errors()[0]
    loc = list(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    original = (error.get("ctx") or {}).get("error")
    if isinstance(original, JobSpecError):  # raised by a model validator: it knows the field inside the model
        loc.append(original.path)
        message = original.reason
    path = _loc_to_path(loc)
    if prefix:
        path = f"{prefix}.{path}" if path and not path.startswith("[") else f"{prefix}{path}"
    return JobSpecError(path, message)


def parse_spec(data: Any, where: str = "") -> TrainingJobSpec:
    """Validate one spec mapping; errors are JobSpecError with the field path (prefixed by `where`)."""
    try:
        return TrainingJobSpec.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, where) from None


def load_job_file(path: str | Path) -> list[TrainingJobSpec]:
    """Specs from a YAML file: one spec mapping, a list of specs, or a mapping with a `jobs:` list.

    Errors name the file and the field: `<file>: jobs[1].dataset.uri: ...`.
    """
    file = Path(path)
    try:
        document = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise JobSpecError(str(file), f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise JobSpecError(str(file), f"not valid YAML: {exc}".splitlines()[0]) from None
    if isinstance(document, dict) and set(document) == {"jobs"}:
        document = document["jobs"]
    items = document if isinstance(document, list) else [document]
    if not items or not all(isinstance(item, dict) for item in items):
        raise JobSpecError(str(file), "expected a job spec mapping, a list of them, or {jobs: [...]}")
    specs = []
    for index, item in enumerate(items):
        where = f"jobs[{index}]" if isinstance(document, list) else ""
        try:
            specs.append(parse_spec(item, where))
        except JobSpecError as exc:
            raise JobSpecError(f"{file}: {exc.path}" if exc.path else str(file), exc.reason) from None
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise JobSpecError(f"{file}: name", f"duplicate job names {', '.join(duplicates)}")
    return specs


# ----------------------------------------------------------------------------------------------------
# Rendering


def _candidate_pools(spec: TrainingJobSpec, facts: ClusterFacts) -> list[PoolFacts]:
    """The pools a pod of this spec can land on; raises JobSpecError naming the field that rules them out."""
    if spec.gpus == 0:
        pools = [pool for pool in facts.pools if pool.gpus_per_node == 0] or list(facts.pools)
        field = "gpus"
    else:
        gpu_pools = [pool for pool in facts.pools if pool.gpus_per_node > 0]
        types = sorted({pool.gpu_type or "unknown" for pool in gpu_pools})
        if not gpu_pools:
            raise JobSpecError("gpus", f"{spec.gpus} GPUs requested but stack {facts.stack} has no GPU pool")
        if spec.gpu_type is not None:
            gpu_pools = [pool for pool in gpu_pools if pool.gpu_type == spec.gpu_type]
            if not gpu_pools:
                raise JobSpecError(
                    "gpuType",
                    f"{spec.gpu_type} is not offered by stack {facts.stack} (GPU types: {', '.join(types)})",
                )
        elif len(types) > 1:
            raise JobSpecError(
                "gpuType", f"required: stack {facts.stack} has several GPU types ({', '.join(types)})"
            )
        fitting = [pool for pool in gpu_pools if pool.gpus_per_node >= spec.gpus]
        if not fitting:
            most = max(pool.gpus_per_node for pool in gpu_pools)
            raise JobSpecError("gpus", f"{spec.gpus} GPUs per pod but the largest matching node has {most}")
        pools, field = fitting, "gpus"
    if spec.dataset is not None and spec.dataset.staging != "none":
        nvme = [pool for pool in pools if pool.nvme_gib > 0]
        if not nvme:
            raise JobSpecError(
                "dataset.staging",
                f"staging {spec.dataset.staging} needs NVMe instance store, "
                f"but no matching pool has any ({_pool_names(pools)})",
            )
        pools = nvme
    if not pools:
        raise JobSpecError(field, f"stack {facts.stack} has no node pool for this job")
    return pools


def _pool_names(pools: Sequence[PoolFacts]) -> str:
    return ", ".join(pool.name for pool in pools)


def _ephemeral_bytes(spec: TrainingJobSpec) -> int:
    return quantity_bytes(spec.ephemeral_storage) + spec.staged_bytes()


def _sidecar_requests(spec: TrainingJobSpec) -> tuple[int, int]:
    """(cpu millicores, memory bytes) that run beside the trainer for the whole pod's life."""
    rolling = spec.dataset is not None and spec.dataset.staging == "rolling"
    return (STAGER_CPU_MILLICORES, STAGER_MEMORY) if rolling else (0, 0)


def _per_gpu_default(field: str, per_gpu: Sequence[int | None], spec: TrainingJobSpec) -> int:
    """The smallest matching pool's per-GPU size times the spec's GPUs; an error naming `field` when none applies."""
    sizes = [size for size in per_gpu if size]
    if spec.gpus == 0 or not sizes:
        why = "CPU-only job" if spec.gpus == 0 else "pools have no per-GPU size"
        raise JobSpecError(field, f"required: no per-GPU {'CPU' if field == 'cpu' else field} default applies ({why})")
    return min(sizes) * spec.gpus


def _resolve_resources(spec: TrainingJobSpec, pools: Sequence[PoolFacts]) -> tuple[int, int]:
    """(cpu millicores, memory bytes) of the train container: the spec's, or the smallest matching per-GPU
    size x gpus, less what a sidecar stager takes."""
    sidecar_cpu, sidecar_memory = _sidecar_requests(spec)
    if spec.cpu is not None:
        cpu = quantity_millicores(spec.cpu)
    else:
        cpu = _per_gpu_default("cpu", [pool.cpu_per_gpu_millicores for pool in pools], spec) - sidecar_cpu
    if spec.memory is not None:
        memory = quantity_bytes(spec.memory)
    else:
        memory = _per_gpu_default("memory", [pool.memory_per_gpu_bytes for pool in pools], spec) - sidecar_memory
        shortfall = _memory_shortfall(memory, spec)
        if shortfall:
            raise JobSpecError(
                "memory",
                f"default {shortfall}; the default is the pool's per-GPU memory x {spec.gpus}"
                f"{' less the stager sidecar' if sidecar_memory else ''}: set memory or shrink shmSize/ramDisk",
            )
    return cpu, memory


def _check_fits_node(spec: TrainingJobSpec, pools: Sequence[PoolFacts], cpu: int, memory: int) -> None:
    """A pod larger than every matching node would stay Pending forever: reject it with the numbers."""
    sidecar_cpu, sidecar_memory = _sidecar_requests(spec)
    cpu, memory = cpu + sidecar_cpu, memory + sidecar_memory
    gpu_pools = [pool for pool in pools if pool.gpus_per_node > 0]
    sized = [pool for pool in gpu_pools if pool.memory_per_gpu_bytes and pool.cpu_per_gpu_millicores]
    if sized:
        max_memory = max(pool.memory_per_gpu_bytes * pool.gpus_per_node for pool in sized)  # type: ignore[operator]
        max_cpu = max(pool.cpu_per_gpu_millicores * pool.gpus_per_node for pool in sized)  # type: ignore[operator]
        if memory > max_memory:
            raise JobSpecError(
                "memory",
                f"{format_bytes(memory)} per pod exceeds the largest matching node's "
                f"allocatable {format_bytes(max_memory)} ({_pool_names(sized)})",
            )
        if cpu > max_cpu:
            raise JobSpecError(
                "cpu",
                f"{format_millicores(cpu)} per pod exceeds the largest matching node's "
                f"allocatable {format_millicores(max_cpu)} ({_pool_names(sized)})",
            )
    if spec.is_staged():
        largest = max(pool.nvme_gib for pool in pools)
        ephemeral = _ephemeral_bytes(spec)
        if ephemeral > largest * GIB:
            raise JobSpecError(
                "dataset.stagedSize",
                f"staging needs {format_bytes(ephemeral)} of ephemeral "
                f"storage (staged size + headroom + ephemeralStorage) but the "
                f"largest NVMe of a matching pool is {largest}Gi",
            )


def _labels(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": spec.name,
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/component": "training",
        "app.kubernetes.io/part-of": "ml-cluster",
        "app.kubernetes.io/managed-by": "ml-cluster",
        f"{facts.label_prefix}/stack": facts.stack,
    }


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _object_store_env(facts: ClusterFacts) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, envFrom) for a container that talks to the object store: region on AWS, HMAC Secret on COS."""
    env = [{"name": "AWS_REGION", "value": facts.region}] if facts.region else []
    env_from = [{"secretRef": {"name": facts.object_store_secret}}] if facts.object_store_secret else []
    return env, env_from


def _stage_container(
    spec: TrainingJobSpec, facts: ClusterFacts, scratch_mount: dict[str, Any]
) -> dict[str, Any]:
    dataset = spec.dataset
    assert dataset is not None and dataset.staging != "none"
    container: dict[str, Any] = {
        "name": STAGE_CONTAINER,
        "image": spec.image,
        "securityContext": _security_context(),
        "volumeMounts": [scratch_mount],
        # Small and Burstable: staging is network-bound; the scratch bytes are in the train container's limit.
        "resources": {"requests": dict(STAGER_RESOURCES), "limits": dict(STAGER_RESOURCES)},
    }
    if dataset.uri is not None:
        command = [
            "python",
            "-m",
            "workloads.data",
            "stage",
            dataset.uri,
            dataset.mount_path,
            "--workers",
            str(dataset.stager_workers),
        ]
        if facts.object_store_endpoint:
            command += ["--endpoint-url", facts.object_store_endpoint]
        if dataset.staging == "rolling":
            # --linger: keep serving the window until the pod stops it (a native sidecar that exits is restarted).
            command += ["--window", str(math.ceil(quantity_bytes(dataset.staged_size or "0") / GIB)), "--linger"]
            container["restartPolicy"] = "Always"  # native sidecar: runs beside the trainer, stops after it
        env, env_from = _object_store_env(facts)
        if env:
            container["env"] = env
        if env_from:
            container["envFrom"] = env_from
    else:
        command = ["cp", "-a", "/mnt/dataset-source/.", dataset.mount_path + "/"]
        container["volumeMounts"] = [
            scratch_mount,
            {"name": "dataset-source", "mountPath": "/mnt/dataset-source", "readOnly": True},
        ]
    container["command"] = command
    return container


def _train_command(spec: TrainingJobSpec) -> list[str] | None:
    if spec.command is not None:
        return list(spec.command)
    if spec.nodes > 1 or spec.gpus > 1:
        # torchrun reads its options from PET_* (set below); one worker process per GPU.
        return ["torchrun", "--module", "workloads.train"]
    return None  # the image's entrypoint: python -m workloads.train


def _train_args(spec: TrainingJobSpec) -> list[str]:
    """The spec's args; for the project's entrypoint, preceded by the data and checkpoint paths it mounts.

    `--resume` is safe on a first run (no checkpoint: a fresh start) and makes a retried pod continue.
    """
    args = list(spec.args)
    if spec.command is not None:
        return args
    implied: list[str] = []
    if spec.dataset is not None and "--data" not in args:
        implied += ["--data", spec.dataset.mount_path]
    if spec.dataset is not None and spec.dataset.staging == "rolling" and "--wait-for-data" not in args:
        # The sidecar writes the manifest once it has the first shards; the trainer may start before that.
        implied += ["--wait-for-data", str(ROLLING_START_TIMEOUT_S)]
    checkpoint = spec.checkpoint
    if checkpoint is not None and checkpoint.claim_name is not None and "--checkpoint-dir" not in args:
        implied += ["--checkpoint-dir", checkpoint.mount_path]
    if checkpoint is not None and checkpoint.uri is not None and "--checkpoint-uri" not in args:
        implied += ["--checkpoint-uri", checkpoint.uri]  # written locally, mirrored there, pulled on a new node
    if checkpoint is not None and "--resume" not in args:
        implied.append("--resume")
    return implied + args


def _train_env(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in sorted(spec.env.items())]
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for name, ref in sorted(spec.secret_env.items())
    ]
    env.append({"name": "CONFIG_ERROR_EXIT_CODE", "value": str(CONFIG_ERROR_EXIT_CODE)})
    if spec.dataset is not None:
        env.append({"name": "DATA_DIR", "value": spec.dataset.mount_path})
        env.append({"name": "DATA_STAGING", "value": spec.dataset.staging})
    if spec.checkpoint is not None:
        if spec.checkpoint.claim_name is not None:
            env.append({"name": "CHECKPOINT_DIR", "value": spec.checkpoint.mount_path})
        else:
            env.append({"name": "CHECKPOINT_URI", "value": spec.checkpoint.uri})
    nproc = max(spec.gpus, 1)
    if spec.nodes > 1:
        master = f"{job_name}-0.{job_name}.{facts.namespace}.svc"
        env += [
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
            {
                "name": "NODE_RANK",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            {"name": "PET_NNODES", "value": str(spec.nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
            {"name": "PET_RDZV_BACKEND", "value": "c10d"},
            {"name": "PET_RDZV_ENDPOINT", "value": f"{master}:{RENDEZVOUS_PORT}"},
            {"name": "PET_RDZV_ID", "value": job_name},
        ]
    elif spec.gpus > 1:
        env += [{"name": "PET_STANDALONE", "value": "1"}, {"name": "PET_NPROC_PER_NODE", "value": str(nproc)}]
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        store_env, _ = _object_store_env(facts)
        env += store_env
    return env


def _check_claims(spec: TrainingJobSpec, facts: ClusterFacts) -> None:
    """A claim the namespace does not have leaves the pod Pending forever: reject it up front."""
    if facts.volume_claims is None:
        return
    for field_name, claim in (("dataset.claimName", spec.dataset.claim_name if spec.dataset else None),
                              ("checkpoint.claimName", spec.checkpoint.claim_name if spec.checkpoint else None)):
        if claim and claim not in facts.volume_claims:
            known = ", ".join(sorted(facts.volume_claims)) or "none"
            raise JobSpecError(field_name, f"{claim} is not a claim in namespace {facts.namespace} of stack "
                                           f"{facts.stack} (claims: {known})")


def _render_manifests(spec: TrainingJobSpec, facts: ClusterFacts, job_name: str) -> list[dict[str, Any]]:
    _check_claims(spec, facts)
    pools = _candidate_pools(spec, facts)
    cpu, memory = _resolve_resources(spec, pools)
    _check_fits_node(spec, pools, cpu, memory)
    ephemeral = _ephemeral_bytes(spec)
    labels = _labels(spec, facts, job_name)
    prefix = facts.label_prefix

    limits: dict[str, str] = {
        "cpu": format_millicores(cpu),
        "memory": format_bytes(memory),
        "ephemeral-storage": format_bytes(ephemeral),
    }
    if spec.gpus > 0:
        limits["nvidia.com/gpu"] = str(spec.gpus)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.shm_bytes())}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if spec.ram_disk is not None:
        volumes.append(
            {
                "name": "ramdisk",
                "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.ram_disk_bytes())},
            }
        )
        mounts.append({"name": "ramdisk", "mountPath": spec.ram_disk.mount_path})

    init_containers: list[dict[str, Any]] = []
    dataset = spec.dataset
    if dataset is not None and dataset.staging != "none":
        # No medium: the emptyDir lives on the kubelet's disk, the NVMe RAID0 on nodes labelled disktype=nvme.
        volumes.append({"name": "dataset", "emptyDir": {"sizeLimit": format_bytes(spec.staged_bytes())}})
        scratch_mount = {"name": "dataset", "mountPath": dataset.mount_path}
        # The rolling reader writes its progress file next to the shards; a copied dataset is read-only.
        mounts.append({**scratch_mount, "readOnly": dataset.staging == "copy"})
        if dataset.claim_name is not None:
            volumes.append(
                {
                    "name": "dataset-source",
                    "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True},
                }
            )
        init_containers.append(_stage_container(spec, facts, scratch_mount))
    elif dataset is not None:
        volumes.append(
            {"name": "dataset", "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True}}
        )
        mounts.append({"name": "dataset", "mountPath": dataset.mount_path, "readOnly": True})
    if spec.checkpoint is not None and spec.checkpoint.claim_name is not None:
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}}
        )
        mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint.mount_path})

    train: dict[str, Any] = {
        "name": TRAIN_CONTAINER,
        "image": spec.image,
        "env": _train_env(spec, facts, job_name),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "securityContext": _security_context(),
        "volumeMounts": mounts,
    }
    command = _train_command(spec)
    if command is not None:
        train["command"] = command
    args = _train_args(spec)
    if args:
        train["args"] = args
    if spec.checkpoint is not None and spec.checkpoint.uri is not None:
        object_env, object_env_from = _object_store_env(facts)
        if facts.object_store_endpoint:  # boto3 reads it: the trainer's checkpoint mirror talks to COS
            object_env.append({"name": "AWS_ENDPOINT_URL_S3", "value": facts.object_store_endpoint})
        train["env"] = [*train.get("env", []), *(e for e in object_env if e not in train.get("env", []))]
        if object_env_from:
            train["envFrom"] = object_env_from
    if spec.nodes > 1:
        train["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]

    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    if spec.gpus > 0:
        gpu_type = spec.gpu_type or pools[0].gpu_type
        if gpu_type:
            node_selector[f"{prefix}/gpu-type"] = gpu_type
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    if spec.is_staged():
        node_selector[f"{prefix}/disktype"] = "nvme"
    tolerations += [
        toleration.model_dump(by_alias=True, exclude_none=True) for toleration in spec.tolerations
    ]

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": facts.job_service_account,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,  # time to write a last checkpoint on SIGTERM
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_UID,
            "runAsGroup": RUN_AS_UID,
            "fsGroup": RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [train],
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    if spec.nodes > 1:
        pod_spec["subdomain"] = job_name

    job_labels = dict(labels)
    if spec.queue:
        job_labels["kueue.x-k8s.io/queue-name"] = spec.queue
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.backoff_limit,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": TRAIN_CONTAINER,
                        "operator": "In",
                        "values": [CONFIG_ERROR_EXIT_CODE],
                    },
                },
                # Spot reclaim, preemption, node drain: retry without spending backoffLimit.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": {
            # A running training pod is never a scale-down candidate: evicting it loses the work since the last
            # checkpoint.
            "metadata": {"labels": dict(labels),
                         "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
            "spec": pod_spec,
        },
    }
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.nodes > 1:
        job_spec.update({"completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes})
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": facts.namespace,
            "labels": job_labels,
            "annotations": {"pulumi.com/skipAwait": "true"},
        },
        "spec": job_spec,
    }
    manifests = [job]
    if spec.nodes > 1:
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": job_name, "namespace": facts.namespace, "labels": dict(labels)},
                "spec": {
                    "clusterIP": "None",
                    # Peers must resolve each other while starting up, before any readiness.
                    "publishNotReadyAddresses": True,
                    "selector": {"app.kubernetes.io/instance": job_name},
                    "ports": [
                        {
                            "name": "rendezvous",
                            "port": RENDEZVOUS_PORT,
                            "targetPort": RENDEZVOUS_PORT,
                            "protocol": "TCP",
                        }
                    ],
                },
            }
        )
    return manifests


def spec_hash(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    """A short hash of everything rendered for the spec: any change to the Job's content changes the name."""
    manifests = _render_manifests(spec, facts, spec.name)
    canonical = json.dumps(manifests, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def job_name(spec: TrainingJobSpec, facts: ClusterFacts) -> str:
    return f"{spec.name}-{spec_hash(spec, facts)}"


def render_job(spec: TrainingJobSpec, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The Job (first) and, for multi-node specs, its headless Service. Raises JobSpecError (field path)."""
    return _render_manifests(spec, facts, job_name(spec, facts))
