"""Which node pools a spec can land on, and the cpu/memory/ephemeral-storage it gets there."""

from __future__ import annotations

from collections.abc import Sequence

from workloads.cluster_facts import EVICTION_HARD_NODEFS, ClusterFacts, PoolFacts
from workloads.jobspec.fields import GIB, STAGER_CPU_MILLICORES, STAGER_EPHEMERAL, STAGER_MEMORY, JobSpecError
from workloads.jobspec.spec import TrainingJobSpec, memory_shortfall
from workloads.quantity import (
    format_bytes,
    format_millicores,
    quantity_bytes,
    quantity_millicores,
)


def candidate_pools(spec: TrainingJobSpec, facts: ClusterFacts) -> list[PoolFacts]:
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
            raise JobSpecError("gpus", f"{spec.gpus} GPUs per pod but the largest matching node has {most}"
                                       f"{_split_hint(spec.gpus, spec.nodes, most)}")
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


def _split_hint(gpus: int, nodes: int, most: int) -> str:
    """How the same GPUs spread over nodes of `most` GPUs each (gpus is per pod, one pod per node)."""
    total = gpus * nodes
    fewest = -(-total // most)
    for count in range(max(fewest, nodes), 2 * fewest + 1):
        if total % count == 0 and total // count <= most:
            return (f": gpus is per pod, one pod per node; for {total} GPUs set nodes: {count} and "
                    f"gpus: {total // count}")
    return f": gpus is per pod, one pod per node; set nodes: {fewest} and gpus: {most} ({fewest * most} GPUs)"


def _pool_names(pools: Sequence[PoolFacts]) -> str:
    return ", ".join(pool.name for pool in pools)


def ephemeral_bytes(spec: TrainingJobSpec) -> int:
    """The train container's ephemeral-storage: its scratch plus the staging emptyDir (budget or dataset + headroom),
    the same rule whether an init container or a sidecar stager fills it, plus the decode cache's emptyDir."""
    return quantity_bytes(spec.ephemeral_storage) + spec.staged_bytes() + spec.decoded_bytes()


def _has_sidecar(spec: TrainingJobSpec) -> bool:
    return spec.dataset is not None and spec.dataset.has_sidecar()


def _sidecar_requests(spec: TrainingJobSpec) -> tuple[int, int]:
    """(cpu millicores, memory bytes) that run beside the trainer for the whole pod's life."""
    return (STAGER_CPU_MILLICORES, STAGER_MEMORY) if _has_sidecar(spec) else (0, 0)


def _per_gpu_default(field: str, per_gpu: Sequence[int | None], spec: TrainingJobSpec) -> int:
    """The smallest matching pool's per-GPU size times the spec's GPUs; an error naming `field` when none applies."""
    sizes = [size for size in per_gpu if size]
    if spec.gpus == 0 or not sizes:
        why = "CPU-only job" if spec.gpus == 0 else "pools have no per-GPU size"
        raise JobSpecError(field, f"required: no per-GPU {'CPU' if field == 'cpu' else field} default applies ({why})")
    return min(sizes) * spec.gpus


def resolve_resources(spec: TrainingJobSpec, pools: Sequence[PoolFacts]) -> tuple[int, int]:
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
        shortfall = memory_shortfall(memory, spec)
        if shortfall:
            raise JobSpecError(
                "memory",
                f"default {shortfall}; the default is the pool's per-GPU memory x {spec.gpus}"
                f"{' less the stager sidecar' if sidecar_memory else ''}: set memory or shrink shmSize/ramDisk",
            )
    return cpu, memory


def check_fits_node(spec: TrainingJobSpec, pools: Sequence[PoolFacts], cpu: int, memory: int) -> None:
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
        roomiest = max(pools, key=lambda pool: pool.nvme_allocatable_gib())
        usable = roomiest.nvme_allocatable_gib()
        # A sidecar's own ephemeral-storage adds to the pod's request; an init container's is over before the trainer.
        sidecar = STAGER_EPHEMERAL if _has_sidecar(spec) else 0
        ephemeral = ephemeral_bytes(spec) + sidecar
        if ephemeral > usable * GIB:
            raise JobSpecError(
                "dataset.stagedSize",
                f"staging needs {format_bytes(ephemeral)} of ephemeral "
                f"storage (staged size + headroom + ephemeralStorage"
                f"{f' + decoded samples {format_bytes(spec.decoded_bytes())}' if spec.decoded_bytes() else ''}"
                f"{f' + the stager sidecar {format_bytes(sidecar)}' if sidecar else ''}) but pods get at most "
                f"{usable}Gi of a matching pool's NVMe ({roomiest.name}: {roomiest.nvme_gib}Gi, less the "
                f"kubelet's nodefs.available<{EVICTION_HARD_NODEFS:.0%} eviction reserve)",
            )
