"""The gang controllers beside the batch/v1 Indexed Job: JobSet and Kubeflow Trainer v2 (`ml-cluster:jobControllers`).

Both come from their upstream charts at pinned versions (tests/charts/upstream, docs/versions.md). Trainer's chart
carries JobSet as a subchart; it is switched off (`jobset.install: false`) so one JobSet release, installed first,
serves both. The stack's ClusterTrainingRuntimes (built by workloads.jobspec from the same pod template as its Jobs)
are created after the Trainer release, whose templates hold their CRD and webhook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.charts import JOBSET, TRAINER
from infra.config.controllers import JobControllersConfig
from infra.config.schema import ConfigError
from infra.context import ClusterInfo, StackContext
from workloads.cluster_facts import ClusterFacts
from workloads.jobspec import JobSpecError, TrainingJobSpec
from workloads.jobspec.runtimes import StagedRuntime, plain_runtimes, staged_runtime

JOBSET_CHART, JOBSET_REPO = JOBSET.release, JOBSET.repo
TRAINER_CHART, TRAINER_REPO = TRAINER.release, TRAINER.repo
Manifest = Mapping[str, Any]


def jobset_values() -> dict[str, Any]:
    """The chart's defaults: its controller already requests 500m/128Mi with limits 2/4Gi
    (charts/jobset/values.yaml:53-59 at v0.12.0)."""
    return {}


def trainer_values() -> dict[str, Any]:
    """Upstream's runtimes stay off (`runtimes.defaultEnabled: false`, charts/kubeflow-trainer/values.yaml:190-193):
    the stack ships its own; the JobSet subchart too (`jobset.install`, values.yaml:31-37): the stack's JobSet
    release serves it; data cache (LeaderWorkerSet) off (values.yaml:164-167)."""
    return {"jobset": {"install": False}, "dataCache": {"enabled": False},
            "manager": {"resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}}}


def check_job_kinds(cfg: JobControllersConfig, jobs: Sequence[TrainingJobSpec]) -> None:
    """A stack Job of kind JobSet or TrainJob needs its controller in the stack; ConfigError naming each."""
    needs = {"JobSet": ("jobset", cfg.jobset.enabled), "TrainJob": ("trainer", cfg.trainer.enabled)}
    problems = [(f"ml-cluster:jobs[{index}].kind",
                 f"{job.kind} needs its controller: set ml-cluster:jobControllers.{needs[job.kind][0]}.enabled")
                for index, job in enumerate(jobs) if job.kind in needs and not needs[job.kind][1]]
    if problems:
        raise ConfigError(problems)


def trainer_runtimes(cfg: JobControllersConfig, facts: ClusterFacts) -> tuple[Manifest, ...]:
    """The stack's ClusterTrainingRuntimes (none without trainer); ConfigError for one the cluster cannot run."""
    trainer = cfg.trainer
    if not trainer.enabled:
        return ()
    where = "ml-cluster:jobControllers.trainer"
    if trainer.runtime_image is not None:
        image = {"image": trainer.runtime_image}
    elif facts.image_repository is not None:
        image = {"imageTag": trainer.runtime_image_tag}
    else:
        raise ConfigError([(f"{where}.runtimeImage", "the stack has no image registry: give the runtimes' image")])
    runtimes = plain_runtimes(facts, image)
    for index, runtime in enumerate(trainer.staged_runtimes):
        dataset = runtime.dataset.model_dump(by_alias=True, exclude_defaults=True)
        try:
            runtimes.append(staged_runtime(facts, image, StagedRuntime(runtime.name, runtime.gpu_type, dataset)))
        except JobSpecError as exc:
            raise ConfigError([(f"{where}.stagedRuntimes[{index}].{exc.path}", exc.reason)]) from None
    return tuple(runtimes)


@dataclass(frozen=True)
class JobControllersArgs:
    ctx: StackContext
    cluster: ClusterInfo
    config: JobControllersConfig
    runtimes: tuple[Manifest, ...] = ()  # ClusterTrainingRuntimes (with trainer enabled)
    depends_on: tuple[pulumi.Resource, ...] = ()  # node groups: the controllers need a node to run on


class _ClusterObject(pulumi.CustomResource):
    """A cluster-scoped custom resource with every top-level field of its manifest."""

    def __init__(self, name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> None:
        super().__init__(f"kubernetes:{manifest['apiVersion']}:{manifest['kind']}", name, dict(manifest), opts)


class JobControllers(pulumi.ComponentResource):
    """The JobSet release, the Kubeflow Trainer release and the stack's ClusterTrainingRuntimes."""

    releases: list[pulumi.Resource]

    def __init__(self, name: str, args: JobControllersArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:JobControllers", name, None, opts)
        ctx, cfg = args.ctx, args.config
        base = pulumi.ResourceOptions(parent=self, provider=args.cluster.provider, depends_on=list(args.depends_on))
        self.releases = []
        runtime_names: Sequence[str] = ()
        if cfg.jobset.enabled:
            jobset = k8s.helm.v3.Release(
                ctx.name("jobset", "release"), name=JOBSET_CHART, chart=JOBSET_REPO, version=cfg.jobset.chart_version,
                namespace=cfg.jobset.namespace, create_namespace=True, values=jobset_values(), opts=base)
            self.releases.append(jobset)
        if cfg.trainer.enabled:
            trainer = k8s.helm.v3.Release(
                ctx.name("trainer", "release"), name=TRAINER_CHART, chart=TRAINER_REPO,
                version=cfg.trainer.chart_version, namespace=cfg.trainer.namespace, create_namespace=True,
                values=trainer_values(),
                opts=base.merge(pulumi.ResourceOptions(depends_on=[*args.depends_on, *self.releases])))
            self.releases.append(trainer)
            after = pulumi.ResourceOptions(parent=self, provider=args.cluster.provider, depends_on=[trainer])
            for manifest in args.runtimes:
                _ClusterObject(ctx.name("trainer", f"runtime-{manifest['metadata']['name']}"), manifest, after)
            runtime_names = [m["metadata"]["name"] for m in args.runtimes]
        self.register_outputs({"releases": [r.urn for r in self.releases], "runtimes": list(runtime_names)})
