"""Stack config: the gang controllers the stack installs beside Kueue (`ml-cluster:jobControllers`).

A batch/v1 Indexed Job needs no controller. JobSet (kubernetes-sigs/jobset) restarts a gang as one unit against one
failure budget and runs several roles; Kubeflow Trainer v2 runs TrainJobs (what the Kubeflow SDK and NeMo-Run send)
as JobSets built from ClusterTrainingRuntimes. Both are installed from their upstream charts at pinned versions
(docs/versions.md); the stack's ClusterTrainingRuntimes come from the same pod-template builder as its Jobs.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from infra.config.base import DnsLabel, StrictModel, listed_twice
from workloads.jobspec import DatasetSpec

# oci://registry.k8s.io/jobset/charts/jobset and oci://ghcr.io/kubeflow/charts/kubeflow-trainer (docs/versions.md)
JOBSET_CHART_VERSION = "0.12.0"
TRAINER_CHART_VERSION = "2.3.0"
# The Kueue integrations (its Configuration's integrations.frameworks) that manage each kind.
JOBSET_INTEGRATION = "jobset.x-k8s.io/jobset"
TRAINJOB_INTEGRATION = "trainer.kubeflow.org/trainjob"
_VERSION = r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$"


class JobSetConfig(StrictModel):
    """The JobSet controller and webhook (jobset.x-k8s.io/v1alpha2 JobSet)."""

    enabled: bool = False
    """install the JobSet controller: Job specs may ask for kind JobSet"""
    chart_version: str = Field(default=JOBSET_CHART_VERSION, pattern=_VERSION)
    """the jobset chart's version (oci://registry.k8s.io/jobset/charts/jobset)"""
    namespace: DnsLabel = "jobset-system"
    """the namespace the controller is installed in"""


class StagedRuntimeConfig(StrictModel):
    """A ClusterTrainingRuntime with a dataset behind the staging cache: the stager sidecar fetches it onto the
    node's NVMe in the order the trainer reads it, as for a Job spec's dataset."""

    name: DnsLabel = Field(max_length=52)
    """the ClusterTrainingRuntime's name (a TrainJob's runtimeRef)"""
    gpu_type: DnsLabel
    """the GPU type of the pools it runs on (a whole node per pod)"""
    dataset: DatasetSpec
    """the dataset, as a Job spec's dataset (bucket + prefix or uri, staging)"""


class TrainerConfig(StrictModel):
    """The Kubeflow Trainer v2 controller (trainer.kubeflow.org/v1alpha1 TrainJob, ClusterTrainingRuntime) and the
    stack's ClusterTrainingRuntimes: `torch-distributed-<gpu type>` per GPU type of the pools, and
    `torch-distributed-<gpu type>-staged` with the staging cache."""

    enabled: bool = False
    """install Kubeflow Trainer and the stack's ClusterTrainingRuntimes (needs jobset)"""
    chart_version: str = Field(default=TRAINER_CHART_VERSION, pattern=_VERSION)
    """the kubeflow-trainer chart's version (oci://ghcr.io/kubeflow/charts/kubeflow-trainer)"""
    namespace: DnsLabel = "kubeflow-system"
    """the namespace the controller is installed in"""
    runtime_image_tag: str = Field(default="latest", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    ("the tag of the stack's training image the runtimes run (a TrainJob's trainer.image replaces it); onprem: "
     "runtimeImage")
    runtime_image: str | None = Field(default=None, min_length=1)
    """the runtimes' image in full (no registry of the stack's own, e.g. onprem)"""
    staged_runtimes: list[StagedRuntimeConfig] = []
    """runtimes with a dataset behind the staging cache, beside torch-distributed-<gpu type>"""

    @model_validator(mode="after")
    def _names(self) -> TrainerConfig:
        twice = listed_twice(runtime.name for runtime in self.staged_runtimes)
        if twice:
            raise ValueError(f"stagedRuntimes names must be unique: {', '.join(twice)}")
        return self


class JobControllersConfig(StrictModel):
    jobset: JobSetConfig = Field(default_factory=JobSetConfig)
    """the JobSet controller"""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Kubeflow Trainer v2 and the stack's ClusterTrainingRuntimes"""

    @model_validator(mode="after")
    def _trainer_needs_jobset(self) -> JobControllersConfig:
        """Kubeflow Trainer runs each TrainJob as a JobSet: trainer needs jobset enabled (the chart's own JobSet
        subchart is not installed, so one JobSet controller serves both)."""
        if self.trainer.enabled and not self.jobset.enabled:
            raise ValueError("trainer.enabled needs jobset.enabled: Kubeflow Trainer runs every TrainJob as a JobSet")
        if self.jobset.namespace == self.trainer.namespace and self.trainer.enabled:
            raise ValueError(f"jobset and trainer share namespace {self.jobset.namespace!r}: give each its own")
        return self

    def integrations(self) -> list[str]:
        """The Kueue integrations the enabled controllers need."""
        return [name for name, on in ((JOBSET_INTEGRATION, self.jobset.enabled),
                                      (TRAINJOB_INTEGRATION, self.trainer.enabled)) if on]
