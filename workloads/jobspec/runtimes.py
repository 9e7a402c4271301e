"""The stack's Kubeflow Trainer ClusterTrainingRuntimes, built by the same pod-template builder as its Jobs.

`torch-distributed-<gpu type>` per GPU type of the stack's pools: a whole node per pod (the type's largest pool's
GPUs), the staging sidecar's and checkpoint's absence aside the pod of a multi-node Job spec on that type (EFA
interfaces and hugepages where the pools have EFA, the health gate, /dev/shm, metrics ports, the exit-code rules).
A staged runtime (ml-cluster:jobControllers.trainer.stagedRuntimes) adds a dataset behind the staging cache: its
stager sidecar, the NVMe emptyDir and the NVMe node selector. A TrainJob names one in `runtimeRef` and gives its
image, command, args, env and numNodes (Trainer replaces only those, see workloads.jobspec.controllers.trainjob).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.controllers.trainjob import cluster_runtime, runtime_address
from workloads.jobspec.pod import Manifest, build_pod
from workloads.jobspec.spec import TrainingJobSpec

RUNTIME_PREFIX = "torch-distributed"
# The runtimes' pods are built as a gang of this many nodes (the rendezvous environment of a multi-node pod); a
# TrainJob's numNodes sets the real count.
_TEMPLATE_NODES = 2


@dataclass(frozen=True)
class StagedRuntime:
    """A runtime with a dataset behind the staging cache: `dataset` as a Job spec's (camelCase keys)."""

    name: str
    gpu_type: str
    dataset: Mapping[str, Any]


def runtime_name(gpu_type: str) -> str:
    return f"{RUNTIME_PREFIX}-{gpu_type}"


def gpu_types(facts: ClusterFacts) -> dict[str, int]:
    """{GPU type: the most GPUs one node of that type has}, over the stack's pools."""
    types: dict[str, int] = {}
    for pool in facts.pools:
        if pool.gpu_type and pool.gpus_per_node > 0:
            types[pool.gpu_type] = max(types.get(pool.gpu_type, 0), pool.gpus_per_node)
    return dict(sorted(types.items()))


def runtime_spec(name: str, gpu_type: str, gpus: int, image: Mapping[str, str],
                 dataset: Mapping[str, Any] | None = None) -> TrainingJobSpec:
    """The spec a runtime's pod is built from: the bundled trainer under the launcher (a TrainJob's command
    replaces it), a whole node of `gpu_type`."""
    raw: dict[str, Any] = {"name": name, **image, "gpus": gpus, "gpuType": gpu_type, "nodes": _TEMPLATE_NODES}
    if dataset is not None:
        raw["dataset"] = dict(dataset)
    return TrainingJobSpec.model_validate(raw)


def _runtime(facts: ClusterFacts, name: str, gpu_type: str, gpus: int, image: Mapping[str, str],
             dataset: Mapping[str, Any] | None = None) -> Manifest:
    spec = runtime_spec(name, gpu_type, gpus, image, dataset)
    return cluster_runtime(build_pod(spec, facts, name, runtime_address()), name)


def plain_runtimes(facts: ClusterFacts, image: Mapping[str, str]) -> list[Manifest]:
    """`torch-distributed-<gpu type>` per GPU type; `image`: {"imageTag": ...} or {"image": ...}."""
    return [_runtime(facts, runtime_name(gpu), gpu, gpus, image) for gpu, gpus in gpu_types(facts).items()]


def staged_runtime(facts: ClusterFacts, image: Mapping[str, str], runtime: StagedRuntime) -> Manifest:
    """A runtime with a dataset behind the staging cache; JobSpecError (its dataset's field path) for one the
    cluster cannot run."""
    return _runtime(facts, runtime.name, runtime.gpu_type, gpu_types(facts).get(runtime.gpu_type, 1), image,
                    runtime.dataset)
