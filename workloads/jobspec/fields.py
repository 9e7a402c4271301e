"""The Job spec's building blocks: the constants the renderer shares, JobSpecError, the field validators and field
types, and the base every spec model derives from (workloads/jobspec/spec.py holds the models)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from workloads.k8snames import is_dns1035_label, is_label_value
from workloads.quantity import (
    format_bytes,
    format_millicores,
    parse_quantity,
)
from workloads.scalars import strict_scalar

# The training entrypoint exits with this code on a configuration error (bad arguments, missing dataset
# manifest, unreadable config). The Job's podFailurePolicy fails the whole Job at once on it instead of
# retrying a run that can never succeed. The trainer exits with DISRUPTION_EXIT_CODE when it was stopped from
# outside (SIGTERM: after a last checkpoint) or lost a peer rank: the Job retries that without counting it. Any other
# non-zero exit counts against backoffLimit.
CONFIG_ERROR_EXIT_CODE = 42
DISRUPTION_EXIT_CODE = 43
# SIGTERM -> the pod is killed: the trainer finishes the step in flight, the ranks agree, every rank saves its share
# of the checkpoint locally, then copies it to the remote tier, and exits. terminationGracePeriodSeconds = STOP_BASE_S
# (the step in flight and staging; a step over a minute needs an explicit terminationGracePeriodSeconds) + the
# checkpoint's size over its write rate, twice when it is also mirrored (local write, then upload), rounded up: the
# whole state as one writer would (an upper bound), or with checkpoint.sharded the per-node share. The trainer's
# "checkpoint" events report bytes, rank_bytes, write_seconds and mirror_seconds: the measured rate of a real run goes
# into checkpoint.writeRate (and localWriteRate).
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



# Field validators and the annotated field types the models use


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
    """Unknown keys are errors; YAML keys are camelCase (snake_case accepted from Python). Booleans and numbers must
    be written as such ('yes', 'true' or '15' in quotes are errors saying what to write: the stack config's rule)."""

    # use_attribute_docstrings: a field's description is the string written under it (docs/reference/ is
    # generated from these descriptions).
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True,
                              use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _written_as_its_type(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return value if field is None else strict_scalar(field.annotation, value)


