"""The interconnect of a multi-node Job: EFA interfaces, hugepages and the libfabric/NCCL environment.

A gang whose pools have EFA (infra: node pools with `efa: true`) asks for every EFA interface of its node and the
hugepages libfabric registers its buffers in, and tells NCCL to use the EFA provider through aws-ofi-nccl (in the
training image). A gang on pools without EFA talks TCP over the primary interface. Single-node Jobs need neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from workloads.cluster_facts import EFA_HUGEPAGES, EFA_RESOURCE, PoolFacts
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.spec import TrainingJobSpec

# libfabric: use the EFA provider (NCCL loads aws-ofi-nccl's net plugin from the image and must not fall back to
# TCP sockets silently), and keep registered memory safe across the fork()s of DataLoader workers. PyTorch: abort a
# collective that failed on another rank instead of waiting in it (the gang restarts rather than hangs).
EFA_ENV = (("FI_PROVIDER", "efa"), ("FI_EFA_FORK_SAFE", "1"))
GANG_ENV = (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),)


@dataclass(frozen=True)
class Fabric:
    efa_interfaces: int = 0  # per pod (= per node: a gang pod holds its node)
    limits: dict[str, str] = field(default_factory=dict)
    env: tuple[tuple[str, str], ...] = ()

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0


def gang_pools(spec: TrainingJobSpec, pools: Sequence[PoolFacts]) -> list[PoolFacts]:
    """The pools a multi-node gang should land on: the EFA ones when any candidate has EFA (a gang on EFA nodes
    never mixes with TCP-only nodes)."""
    if spec.nodes < 2:
        return list(pools)
    with_efa = [pool for pool in pools if pool.efa_interfaces]
    return with_efa or list(pools)


def job_fabric(spec: TrainingJobSpec, pools: Sequence[PoolFacts]) -> Fabric:
    """What the train container of `spec` needs for its interconnect on `pools` (gang_pools' choice)."""
    if spec.nodes < 2:
        return Fabric()
    counts = sorted({pool.efa_interfaces for pool in pools})
    if len(counts) > 1:
        shapes = ", ".join(f"{pool.name} ({pool.efa_interfaces} EFA)" for pool in pools)
        raise JobSpecError("gpuType", f"a gang spans pools with different EFA layouts ({shapes}): pin the GPU type "
                                      "to pools with one layout")
    if not counts[0]:
        return Fabric(env=GANG_ENV)
    return Fabric(efa_interfaces=counts[0], limits={EFA_RESOURCE: str(counts[0]), "hugepages-2Mi": EFA_HUGEPAGES},
                  env=EFA_ENV + GANG_ENV)
