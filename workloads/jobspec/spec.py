"""The training Job spec: the run's pydantic model (TrainingJobSpec, its secrets, RAM disk and tolerations) and the
sizes the renderer derives from it. Constants, field validators and field types are in workloads/jobspec/fields.py;
where the dataset and the checkpoints live, in workloads/jobspec/storage.py."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from workloads.jobspec.checkpointing import SaveShares
from workloads.jobspec.fields import (
    _SECRETISH_ENV,
    DECODED_MOUNT,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_ELASTIC_WAIT_S,
    DEFAULT_RANK_RESTARTS,
    DEFAULT_SHM_PER_GPU,
    GIB,
    HASH_LENGTH,
    MAX_NAME_LENGTH,
    MIN_SHM,
    MIN_STAGING_HEADROOM,
    RENDEZVOUS_JOIN_TIMEOUT_S,
    STAGING_HEADROOM_FRACTION,
    STOP_BASE_S,
    AbsolutePath,
    EnvName,
    Image,
    ImageTag,
    JobName,
    JobSpecError,
    LabelValue,
    PositiveQuantity,
    _Spec,
)
from workloads.jobspec.goodput import GoodputSpec
from workloads.jobspec.storage import CheckpointSpec, DatasetSpec
from workloads.k8snames import DnsLabel, DnsSubdomain
from workloads.quantity import format_bytes, quantity_bytes


class SecretKeyRef(_Spec):
    """An environment value read from a Kubernetes Secret, so it never appears in a manifest or plan."""

    secret: DnsSubdomain
    """the Secret's name, in the Job's namespace"""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    """the key in the Secret whose value the variable gets"""


class RamDiskSpec(_Spec):
    size: PositiveQuantity
    """the RAM disk's sizeLimit"""
    mount_path: AbsolutePath = "/ramdisk"
    """where the RAM disk is mounted in the training container"""


class TolerationSpec(_Spec):
    key: Annotated[str, Field(min_length=1, max_length=316)] | None = None
    """the taint key; unset with operator Exists: every taint"""
    operator: Literal["Equal", "Exists"] = "Equal"
    """Equal: the taint's value must match value; Exists: any value"""
    value: LabelValue | None = None
    """the taint value (operator Equal)"""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """the taint effect tolerated; unset: every effect"""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """NoExecute only: how long the pod stays on a node after the taint appears"""

    @model_validator(mode="after")
    def _check(self) -> TolerationSpec:
        if self.operator == "Exists" and self.value is not None:
            raise JobSpecError("value", "operator Exists takes no value")
        if self.key is None and self.operator != "Exists":
            raise JobSpecError("key", "an empty key needs operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise JobSpecError("tolerationSeconds", "applies only to effect NoExecute")
        return self


class TopologySpec(_Spec):
    """Where a gang's pods are placed in the network, on a stack whose GPU flavors name a Kueue Topology (the EKS
    network layers of EFA pools): rendered as Kueue's podset topology annotation on the pod template."""

    mode: Literal["preferred", "required"] = "preferred"
    ("preferred: in one domain of `level` if it fits, else the next layer up, else spread; required: in one domain of "
     "`level` or not admitted (only on pools that keep all their nodes)")
    level: Literal["layer-1", "layer-2", "layer-3", "layer-4", "hostname"] | None = None
    ("topology.k8s.aws/network-node-layer-N (1: the top of the network, the bottom layer: the closest) or "
     "kubernetes.io/hostname. None: the bottom network layer of the pool's type")


class TrainingJobSpec(_Spec):
    """One training run. Resource fields are per pod (one pod per node)."""

    name: JobName
    """the Job's name (DNS label); the rendered Job is <name>-<hash of the spec>, so a changed spec is a new Job"""
    kind: str = "Job"
    ("the controller that runs the gang, a row of the kind table (workloads/jobspec/kinds.py): Job, a batch/v1 "
     "Indexed Job (no controller to install); JobSet, one failure budget per gang (jobControllers.jobset); TrainJob, "
     "Kubeflow Trainer on a TrainingRuntime of the same pod (jobControllers.trainer)")
    image: Image | None = None
    """Either a full image reference, or a tag of the stack's own registry (ClusterFacts.image_repository)."""
    image_tag: ImageTag | None = None
    """a tag of the stack's own registry (jobFacts.image_repository); the Job runs <repository>:<tag>"""
    command: list[str] | None = Field(default=None, min_length=1)
    ("the container's command, run inside the launcher (see launcher); unset: the image's entrypoint (the bundled "
     "trainer), under the launcher for several GPUs or nodes. With a command, no trainer argument (--data, --resume, "
     "...) is implied")
    launcher: Literal["torchrun", "none"] = "torchrun"
    ("how the pod runs your command: torchrun, inside the in-process torchrun wrapper (python -m "
     "workloads.train.launch, from the training image; one process per GPU, a c10d rendezvous across nodes), so the "
     "pod's exit code tells a config error (42) from a disruption (43) from a crash; none: the command as written "
     "(your own launcher: a lost peer or a SIGTERM is then counted against backoffLimit, and the plan notes it). Only "
     "with command")
    args: list[str] = Field(default_factory=list)
    """the container's arguments; with the bundled trainer, after the data and checkpoint paths the renderer implies"""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """environment variables of the training container (plain values; secrets go in secretEnv)"""
    secret_env: dict[EnvName, SecretKeyRef] = Field(default_factory=dict)
    """environment variables read from Kubernetes Secrets, by variable name"""
    gpus: int = Field(default=1, ge=0, le=16)
    """GPUs per pod (nvidia.com/gpu); 0: a CPU Job"""
    gpu_type: DnsLabel | None = None
    """the pools' GPU type to run on (a10g, h100, ...); required when the stack has several"""
    cpu: PositiveQuantity | None = None
    """default: the pool's per-GPU CPU x gpus"""
    memory: PositiveQuantity | None = None
    """the container's memory limit; default: pool's per-GPU memory x gpus"""
    process_memory: PositiveQuantity = "4Gi"
    """what the process needs besides memory-backed volumes"""
    ephemeral_storage: PositiveQuantity = "10Gi"
    """local scratch besides staging: logs and /tmp (its sizeLimit)"""
    shm_size: PositiveQuantity | None = None
    """/dev/shm; default max(1Gi, 2Gi x gpus)"""
    ram_disk: RamDiskSpec | None = None
    """a memory-backed emptyDir for fast scratch, counted in the memory limit"""
    dataset: DatasetSpec | None = None
    """the training data: its source and how it is staged onto the node"""
    checkpoint: CheckpointSpec | None = None
    """where checkpoints go: a PVC or an object-store prefix"""
    nodes: int = Field(default=1, ge=1, le=512)
    ("pods (one per node; with minNodes, the most); above 1 an Indexed Job with a headless Service and torchrun "
     "rendezvous")
    backoff_limit: int = Field(default=2, ge=0, le=100)
    """failed pods the Job may retry (disruptions such as a Spot reclaim do not count)"""
    active_deadline_seconds: int = Field(default=3 * 86400, ge=60)
    """the longest the Job may run, retries included; then it fails"""
    termination_grace_period_seconds: int | None = Field(default=None, ge=30, le=3600)
    ("Time from SIGTERM to SIGKILL, for the last checkpoint; unset: 60 s plus checkpoint.size over "
     "checkpoint.writeRate (twice when the checkpoint is also uploaded), 60 s without a checkpoint.")
    collective_timeout_seconds: int = Field(default=DEFAULT_COLLECTIVE_TIMEOUT_S, ge=60, le=7200)
    ("Multi-node: the longest a rank waits in a collective for a lost peer; then it exits and the whole gang restarts.")
    rank_restarts: int = Field(default=DEFAULT_RANK_RESTARTS, ge=0, le=100)
    ("Multi-node: torchrun's in-place restarts of a pod's workers before the pod exits (0: it exits and is replaced).")
    min_nodes: int | None = Field(default=None, ge=1, le=512)
    ("Multi-node, elastic: the gang may train on as few as this many nodes (nodes is the most) when lost capacity "
     "does not come back within elasticWaitSeconds, and grows back when it does. The bundled trainer then needs "
     "--global-batch-size in args (divisible by every possible world size): the global batch, the epoch order and the "
     "learning rate stay as they are. None: always all nodes.")
    elastic_wait_seconds: int = Field(default=DEFAULT_ELASTIC_WAIT_S, ge=30, le=RENDEZVOUS_JOIN_TIMEOUT_S - 60)
    """Multi-node, elastic: how long a re-forming gang waits for missing nodes once minNodes have joined."""
    ttl_seconds_after_finished: int | None = Field(default=7 * 86400, ge=0)
    """deletes the finished Job (and its pods) after this long; null keeps it"""
    priority_class: DnsSubdomain | None = None
    """the pods' Kubernetes PriorityClass (priorityClassName)"""
    queue: DnsSubdomain | None = None
    ("Kueue LocalQueue: the whole gang is admitted together. None: the stack's default LocalQueue when it runs Kueue.")
    team: DnsLabel | None = None
    ("A stack team with a namespace (ml-cluster:kueue.teams): the Job runs there, through the team's LocalQueue, as "
     "the team's service account, and may name only the team's bucket prefixes. None: the training namespace.")
    workload_priority: DnsSubdomain | None = None
    """a Kueue WorkloadPriorityClass: order in the queue, preemption"""
    topology: TopologySpec | None = None
    ("Kueue topology-aware placement (stacks with kueue.topology). None: preferred at the bottom network layer "
     "wherever the GPU type's flavor has a Topology; refused elsewhere")
    read_only_root_filesystem: bool = True
    """An image that writes outside /tmp, the RAM disk and its mounts can opt out of the read-only root."""
    suspend: bool | None = None
    ("Created suspended (spec.suspend) and started later, e.g. once its dataset is uploaded. None: the caller's "
     "default, which is suspended for the Jobs a stack deploys and running for `workloads.submit`.")
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    """tolerations beside the GPU taint's, e.g. for a pool's own taints"""
    goodput: GoodputSpec | None = None
    ("What the goodput prediction (plan summary, `submit render`) uses instead of its assumptions: stepSeconds, "
     "mtbfHours, restartSeconds. Not rendered: it changes no manifest.")

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
        if not self._rate_from_claim():
            self.check_save_window()  # else when rendered: the claim's file system may give the rate
        return self

    def _rate_from_claim(self) -> bool:
        """The checkpoint goes to a claim without a stated writeRate: the rate is known once the claim's file
        system is (workloads.jobspec.pod.resolve_checkpoint_rate)."""
        return (self.checkpoint is not None and self.checkpoint.claim_name is not None
                and "write_rate" not in self.checkpoint.model_fields_set)

    def check_save_window(self) -> None:
        """A sharded checkpoint that cannot be saved within the set grace period is a config error: every stop
        (Spot notice, drain, block end) would lose the work since the previous one."""
        grace = self.termination_grace_period_seconds
        if grace is None or self.checkpoint is None or not self.checkpoint.sharded:
            return
        needed = self.stop_seconds()
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
        return self.stop_seconds()

    def _save_shares(self) -> SaveShares:
        assert self.checkpoint is not None
        local = self.checkpoint.local_write_rate
        rate = quantity_bytes(self.checkpoint.write_rate)
        return SaveShares(size=quantity_bytes(self.checkpoint.size), nodes=self.nodes, ranks_per_node=max(1, self.gpus),
                          local_rate=quantity_bytes(local) if local else rate, remote_rate=rate,
                          mirrored=self.checkpoint.uri is not None or self.checkpoint.bucket is not None)

    def stop_seconds(self) -> int:
        """What the stop path needs from SIGTERM to exit: STOP_BASE_S (the step in flight, staging) and the last
        checkpoint's save, both tiers (the trainer waits for the remote copy before it exits)."""
        return STOP_BASE_S + (math.ceil(self.checkpoint_save_seconds()) if self.checkpoint is not None else 0)

    def checkpoint_save_reason(self) -> str:
        """The numbers behind checkpoint_save_seconds, for an error line."""
        assert self.checkpoint is not None
        if self.checkpoint.sharded:
            return self._save_shares().reason()
        size, rate = quantity_bytes(self.checkpoint.size), quantity_bytes(self.checkpoint.write_rate)
        writes = 2 if self.checkpoint.uri is not None or self.checkpoint.bucket is not None else 1
        return (f"{size / 2**30:.1f} GiB whole at {rate / 2**30:.1f} GiB/s"
                f"{', written then mirrored' if writes == 2 else ''} ({writes * size / rate:.0f} s)")

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
