"""The pod-template builder: spec + cluster facts + the gang's address -> the pod template every controller wraps.

Built once here, whatever runs the gang (workloads.jobspec.kinds): the containers (trainer, stager), the volumes
(/dev/shm and the RAM disk as memory-backed emptyDirs, /tmp, the staged dataset on the NVMe-backed emptyDir, the
decode cache, the checkpoint claim), requests == limits (cpu, memory, ephemeral storage, GPUs, EFA interfaces and
hugepages), the security context, the placement (GPU type, NVMe and EFA node selectors, tolerations, the health
gate) and the metrics discovery metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workloads.cluster_facts import ClusterFacts, PoolFacts
from workloads.jobspec.checkpointing import file_system_share
from workloads.jobspec.containers import (
    CHECKPOINT_VOLUME,
    GangAddress,
    dataset_claim_volume,
    stage_container,
    train_container,
)
from workloads.jobspec.defaults import (
    GPU_TAINT,
    TMP_MOUNT,
    TMP_VOLUME,
    app_labels,
    gpu_health_affinity,
    restricted_pod,
    run_once_pod,
    tolerate,
)
from workloads.jobspec.fabric import Fabric, gang_pools, job_fabric
from workloads.jobspec.fields import DECODED_MOUNT, NODE_LOST_TOLERATION_S, TRAIN_METRICS_PORT, JobSpecError
from workloads.jobspec.placement import candidate_pools, check_fits_node, ephemeral_bytes, resolve_resources
from workloads.jobspec.spec import TrainingJobSpec
from workloads.jobspec.topology import topology_annotations
from workloads.quantity import format_bytes, format_millicores, quantity_bytes

Manifest = dict[str, Any]
# Discovery by annotation, for a Prometheus configured the classic way (kubernetes_sd + prometheus.io/*): it names one
# port, local rank 0's. The PodMonitor (infra/monitoring/component.py) scrapes every rank and the stager by port name.
METRICS_LABEL = "metrics"


@dataclass(frozen=True)
class PodTemplate:
    """What a controller wrapper needs: the pod template, the run's labels, and the spec it was built from (its
    buckets resolved)."""

    spec: TrainingJobSpec
    facts: ClusterFacts
    name: str  # the run's name: the controller object's, the rendezvous id
    labels: dict[str, str]  # the run's labels (the pods carry them too)
    template: Manifest  # {"metadata": ..., "spec": the pod spec}


@dataclass
class _Volumes:
    volumes: list[Manifest] = field(default_factory=list)
    mounts: list[Manifest] = field(default_factory=list)
    init_containers: list[Manifest] = field(default_factory=list)


def run_labels(spec: TrainingJobSpec, facts: ClusterFacts, run_name: str) -> dict[str, str]:
    return app_labels(spec.name, "training", facts.stack, facts.label_prefix, instance=run_name)


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


def resolve_buckets(spec: TrainingJobSpec, facts: ClusterFacts) -> TrainingJobSpec:
    """A dataset, a mixture's source or a checkpoint named by the stack's logical bucket gets its s3:// URI from the
    cluster facts."""
    known = facts.buckets or {}

    def uri(name: str, bucket: str, prefix: str) -> str:
        if bucket not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise JobSpecError(f"{name}.bucket", f"{bucket!r} is not a bucket of stack {facts.stack} "
                                                 f"(its buckets: {choices})")
        return f"s3://{known[bucket]}/{prefix}"

    update: dict[str, Any] = {}
    for name, target in (("dataset", spec.dataset), ("checkpoint", spec.checkpoint)):
        if target is not None and target.bucket is not None:
            update[name] = target.model_copy(update={"uri": uri(name, target.bucket, target.prefix)})
    dataset = spec.dataset
    if dataset is not None and dataset.mixture and any(source.bucket is not None for source in dataset.mixture):
        sources = [source if source.bucket is None else source.model_copy(
            update={"uri": uri(f"dataset.mixture[{index}]", source.bucket, source.prefix)})
            for index, source in enumerate(dataset.mixture)]
        update["dataset"] = dataset.model_copy(update={"mixture": sources})
    return spec.model_copy(update=update) if update else spec


def resolve_checkpoint_rate(spec: TrainingJobSpec, facts: ClusterFacts) -> TrainingJobSpec:
    """A checkpoint on a claim of a provisioned-throughput file system (facts.file_systems, FSx for Lustre) is
    written at that file system's share: its baseline throughput over the Job's clients that write at once (rank 0
    alone for a whole checkpoint; every node for a sharded one, its ranks writing their shards into the claim). The
    share is the checkpoint's writeRate; a stated writeRate or localWriteRate above it is an error naming both
    (a stated lower, measured one is kept); a set grace period is checked against the save again."""
    checkpoint = spec.checkpoint
    if checkpoint is None or checkpoint.claim_name is None:
        return spec
    file_system = (facts.file_systems or {}).get(checkpoint.claim_name)
    if file_system is not None:
        writers = spec.nodes if checkpoint.sharded else 1
        share = file_system_share(file_system.bytes_per_second, writers)
        for field_name, attribute in (("writeRate", "write_rate"), ("localWriteRate", "local_write_rate")):
            stated = getattr(checkpoint, attribute)
            if attribute in checkpoint.model_fields_set and stated is not None and quantity_bytes(stated) > share:
                raise JobSpecError(f"checkpoint.{field_name}", (
                    f"{stated} ({quantity_bytes(stated)} bytes/s) is more than claim {checkpoint.claim_name} can "
                    f"give: {share} bytes/s = {file_system.describe()} / {writers} writer(s) at once"))
        if "write_rate" not in checkpoint.model_fields_set:
            spec = spec.model_copy(update={"checkpoint": checkpoint.model_copy(update={"write_rate": str(share)})})
    spec.check_save_window()  # deferred from the spec's own validation (TrainingJobSpec._rate_from_claim)
    return spec


def _limits(spec: TrainingJobSpec, pools: list[PoolFacts], fabric: Fabric) -> dict[str, str]:
    """The train container's requests == limits; the spec is refused when they do not fit a node of its pools."""
    cpu, memory = resolve_resources(spec, pools)
    check_fits_node(spec, pools, cpu, memory)
    limits: dict[str, str] = {
        "cpu": format_millicores(cpu),
        "memory": format_bytes(memory),
        "ephemeral-storage": format_bytes(ephemeral_bytes(spec)),
    }
    if spec.gpus > 0:
        limits["nvidia.com/gpu"] = str(spec.gpus)
    limits.update(fabric.limits)
    return limits


def _memory_volumes(spec: TrainingJobSpec, out: _Volumes) -> None:
    """/dev/shm (DataLoader workers pass batches through it), /tmp, and the optional RAM disk."""
    out.volumes += [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.shm_bytes())}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": spec.ephemeral_storage}},
    ]
    out.mounts += [{"name": "dshm", "mountPath": "/dev/shm"}, TMP_MOUNT]
    if spec.ram_disk is not None:
        out.volumes.append(
            {"name": "ramdisk", "emptyDir": {"medium": "Memory", "sizeLimit": format_bytes(spec.ram_disk_bytes())}})
        out.mounts.append({"name": "ramdisk", "mountPath": spec.ram_disk.mount_path})


def _dataset_volumes(spec: TrainingJobSpec, facts: ClusterFacts, out: _Volumes) -> None:
    dataset = spec.dataset
    if dataset is None:
        return
    # A claim the checkpoint names too is the checkpoints' volume (_volumes adds it), mounted once more read-only.
    source = dataset_claim_volume(spec) if dataset.claim_name is not None else None
    if dataset.staging == "none":
        if source == "dataset":
            out.volumes.append(
                {"name": "dataset", "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True}})
        out.mounts.append({"name": source, "mountPath": dataset.mount_path, "readOnly": True,
                           **dataset_sub_path(spec)})
        return
    # No medium: the emptyDir lives on the kubelet's disk, the NVMe RAID0 on nodes labelled disktype=nvme.
    out.volumes.append({"name": "dataset", "emptyDir": {"sizeLimit": format_bytes(spec.staged_bytes())}})
    scratch_mount = {"name": "dataset", "mountPath": dataset.mount_path}
    # The trainer writes its read plan for the cache into DEST/.cache/; a copied dataset is read-only.
    out.mounts.append({**scratch_mount, "readOnly": not dataset.has_sidecar()})
    if source == "dataset-source":
        out.volumes.append(
            {"name": "dataset-source", "persistentVolumeClaim": {"claimName": dataset.claim_name, "readOnly": True}})
    out.init_containers.append(stage_container(spec, facts, scratch_mount))
    if dataset.decoded_size is not None:
        out.volumes.append({"name": "decoded", "emptyDir": {"sizeLimit": format_bytes(spec.decoded_bytes())}})
        out.mounts.append({"name": "decoded", "mountPath": DECODED_MOUNT})


def dataset_sub_path(spec: TrainingJobSpec) -> dict[str, str]:
    """{"subPath": ...} for a claim dataset read from a directory inside the claim, else {}."""
    sub_path = spec.dataset.sub_path if spec.dataset is not None else None
    return {"subPath": sub_path.rstrip("/")} if sub_path else {}


def _volumes(spec: TrainingJobSpec, facts: ClusterFacts) -> _Volumes:
    out = _Volumes()
    _memory_volumes(spec, out)
    _dataset_volumes(spec, facts, out)
    if spec.checkpoint is not None and spec.checkpoint.claim_name is not None:
        out.volumes.append(
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}})
        out.mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
    return out


def _node_selector(spec: TrainingJobSpec, facts: ClusterFacts, pools: list[PoolFacts],
                   fabric: Fabric) -> dict[str, str]:
    prefix = facts.label_prefix
    selector: dict[str, str] = {}
    if spec.gpus > 0:
        gpu_type = spec.gpu_type or pools[0].gpu_type
        if gpu_type:
            selector[f"{prefix}/gpu-type"] = gpu_type
    if spec.is_staged():
        selector[f"{prefix}/disktype"] = "nvme"
    if fabric.efa:
        selector[f"{prefix}/efa"] = "true"
    return selector


def _tolerations(spec: TrainingJobSpec) -> list[Manifest]:
    tolerations: list[Manifest] = [tolerate(GPU_TAINT)] if spec.gpus > 0 else []
    tolerations += [toleration.model_dump(by_alias=True, exclude_none=True) for toleration in spec.tolerations]
    if spec.nodes > 1:
        own = {toleration.key for toleration in spec.tolerations}
        # a gang's node that stopped answering: evicted after a minute, not five (the replacement pod, and with it
        # the whole gang, starts sooner)
        tolerations += [tolerate(key, "NoExecute", NODE_LOST_TOLERATION_S)
                        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
                        if key not in own]
    return tolerations


def _pod_spec(spec: TrainingJobSpec, facts: ClusterFacts, pools: list[PoolFacts], fabric: Fabric,
              containers: list[Manifest], volumes: _Volumes, gang: GangAddress) -> Manifest:
    pod_spec: Manifest = {
        # SIGTERM: finish the step, write and mirror a last checkpoint (sized from the checkpoint: spec.py)
        **run_once_pod(facts.job_service_account, spec.grace_seconds()),
        "securityContext": restricted_pod(),
        "containers": containers,
        "volumes": volumes.volumes,
    }
    if volumes.init_containers:
        pod_spec["initContainers"] = volumes.init_containers
    node_selector = _node_selector(spec, facts, pools, fabric)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.gpus > 0 and facts.gpu_health_gate:
        pod_spec["affinity"] = gpu_health_affinity(facts.label_prefix)
    tolerations = _tolerations(spec)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    if spec.nodes > 1:
        pod_spec["subdomain"] = gang.subdomain
    return pod_spec


def _template_metadata(labels: dict[str, str], label_prefix: str, topology: dict[str, str]) -> Manifest:
    # A running training pod is never a scale-down candidate: evicting it loses the work since the last checkpoint.
    return {"labels": {**labels, f"{label_prefix}/{METRICS_LABEL}": "true"},
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(TRAIN_METRICS_PORT),
                            "prometheus.io/path": "/metrics", **topology}}


def build_pod(spec: TrainingJobSpec, facts: ClusterFacts, run_name: str, gang: GangAddress) -> PodTemplate:
    """The training pod of `spec` on the cluster of `facts`, for the run `run_name` whose gang finds itself at
    `gang`. Raises JobSpecError (field path) for a spec the cluster cannot run."""
    spec = resolve_buckets(spec, facts)
    _check_claims(spec, facts)
    spec = resolve_checkpoint_rate(spec, facts)
    pools = gang_pools(spec, candidate_pools(spec, facts))
    fabric = job_fabric(spec, pools)
    limits = _limits(spec, pools, fabric)
    labels = run_labels(spec, facts, run_name)
    volumes = _volumes(spec, facts)
    train = train_container(spec, facts, gang, run_name, fabric, limits, volumes.mounts)
    pod_spec = _pod_spec(spec, facts, pools, fabric, [train], volumes, gang)
    topology = topology_annotations(spec, facts, spec.gpu_type or pools[0].gpu_type)  # Kueue's placement request
    template = {"metadata": _template_metadata(labels, facts.label_prefix, topology), "spec": pod_spec}
    return PodTemplate(spec=spec, facts=facts, name=run_name, labels=labels, template=template)
