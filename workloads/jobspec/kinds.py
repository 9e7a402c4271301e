"""The kind table: a spec's `kind` -> the controller wrapper that runs its gang. `up` (infra/jobs.py) and `submit`
(workloads.submit) both render and create through it; neither names a kind.

| kind     | object                                            | wrapper module                                |
| -------- | ------------------------------------------------- | --------------------------------------------- |
| Job      | batch/v1 Job                                      | workloads/jobspec/controllers/indexed_job.py  |
| JobSet   | jobset.x-k8s.io/v1alpha2 JobSet                   | workloads/jobspec/controllers/jobset.py       |
| TrainJob | trainer.kubeflow.org/v1alpha1 TrainJob + runtime  | workloads/jobspec/controllers/trainjob.py     |

A new kind (JobSet, TrainJob) is one module in controllers/ with `API_VERSION`, `KIND`, `PLURAL`,
`gang_address(run_name, namespace)`, `pod_selector(run_name)` and `wrap(pod) -> [the object, companions...]`, plus
one row below. `up` registers an object of a kind it has no typed class for as a CustomResource, and `submit`
creates it through the custom objects API with the row's plural.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workloads.jobspec.containers import GangAddress
from workloads.jobspec.controllers import indexed_job, jobset, trainjob
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.pod import Manifest, PodTemplate
from workloads.jobspec.spec import TrainingJobSpec


@dataclass(frozen=True)
class Controller:
    kind: str  # the spec's `kind`, and the kind of the object (the manifests' first)
    api_version: str  # the object's apiVersion
    plural: str  # its resource name in the API (/apis/<group>/<version>/namespaces/<ns>/<plural>)
    gang_address: Callable[[str, str], GangAddress]  # (run name, namespace) -> how the gang finds rank 0
    pod_selector: Callable[[str], str]  # run name -> the label selector of its pods
    wrap: Callable[[PodTemplate], list[Manifest]]  # the pod template -> [the object, its companions...]

    @property
    def group(self) -> str:
        """The API group ('' for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


KINDS: dict[str, Controller] = {
    "Job": Controller(indexed_job.KIND, indexed_job.API_VERSION, indexed_job.PLURAL, indexed_job.gang_address,
                      indexed_job.pod_selector, indexed_job.wrap),
    "JobSet": Controller(jobset.KIND, jobset.API_VERSION, jobset.PLURAL, jobset.gang_address, jobset.pod_selector,
                         jobset.wrap),
    "TrainJob": Controller(trainjob.KIND, trainjob.API_VERSION, trainjob.PLURAL, trainjob.gang_address,
                           trainjob.pod_selector, trainjob.wrap),
}
DEFAULT_KIND = "Job"


def controller_for(spec: TrainingJobSpec) -> Controller:
    """The row of the spec's kind; JobSpecError (field `kind`) for a kind the table does not have."""
    if spec.kind not in KINDS:
        raise JobSpecError("kind", f"{spec.kind!r} is not a kind this project renders (kinds: {', '.join(KINDS)})")
    return KINDS[spec.kind]


def controller_of(manifest: Manifest) -> Controller | None:
    """The row whose object `manifest` is (by apiVersion and kind); None for a companion (Service, ...)."""
    for controller in KINDS.values():
        if controller.api_version == manifest.get("apiVersion") and controller.kind == manifest.get("kind"):
            return controller
    return None


def run_pod_spec(manifests: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The trainer's pod spec among a run's rendered objects, whatever its kind (for checks over the pod): a Job's
    template, a JobSet's first replicated Job's, a TrainJob's runtime's (rendered beside it)."""
    run = manifests[0]
    if run.get("kind") == jobset.KIND:
        return run["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if run.get("kind") == trainjob.KIND:
        [runtime] = [m for m in manifests if m.get("kind") in (trainjob.RUNTIME_KIND, trainjob.CLUSTER_RUNTIME_KIND)]
        return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return run["spec"]["template"]["spec"]
