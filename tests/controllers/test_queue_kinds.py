"""Kueue's checks over every kind: a queued JobSet or TrainJob needs its Kueue integration, and its gang (the
podSets Kueue makes of it) must fit a flavor's quota like an Indexed Job's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.config.controllers import JobControllersConfig
from infra.config.queueing import KueueConfig
from infra.config.schema import ConfigError
from infra.controllers import check_job_kinds
from infra.nodes.poolplan import pool_facts
from infra.queueing import kueue_facts
from infra.quota import check_queueing, run_podsets
from tests.jobs.facts import dev_facts
from tests.queueing.test_queueing import IMAGE, dev_pools
from workloads.jobspec import parse_spec, render_job

ALL = ["batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]


def rendered(kind: str, integrations: list[str], **fields: Any) -> tuple[KueueConfig, list[list[dict[str, Any]]]]:
    config = KueueConfig.model_validate({"enabled": True, "integrations": integrations})
    facts = replace(dev_facts(), pools=pool_facts(dev_pools()), **kueue_facts(config))
    spec = {"name": "ddp", "image": IMAGE, "gpuType": "a10g", "kind": kind, **fields}
    return config, [render_job(parse_spec(spec), facts)]


@pytest.mark.parametrize("kind", ["Job", "JobSet", "TrainJob"])
def test_each_kind_is_one_podset_of_the_whole_gang(kind: str) -> None:
    _, [manifests] = rendered(kind, ALL, nodes=2)
    [podset] = run_podsets(manifests)
    assert podset["count"] == 2 and podset["requests"].gpus == 1
    assert podset["name"] == {"Job": "main", "JobSet": "trainer", "TrainJob": "node"}[kind]
    config, jobs = rendered(kind, ALL, nodes=2)
    check_queueing(config, dev_pools(), "ml-cluster.io", jobs, ["training"])  # 2 A10G nodes: fits


@pytest.mark.parametrize(("kind", "integration"), [("JobSet", "jobset.x-k8s.io/jobset"),
                                                   ("TrainJob", "trainer.kubeflow.org/trainjob")])
def test_a_queued_kind_kueue_does_not_integrate_is_a_config_error(kind: str, integration: str) -> None:
    config, jobs = rendered(kind, ["batch/job"])
    with pytest.raises(ConfigError) as caught:
        check_queueing(config, dev_pools(), "ml-cluster.io", jobs, ["training"])
    [(path, why)] = caught.value.shown()
    assert path == "ml-cluster:jobs[0].kind"
    assert why.startswith(f"a queued {kind} needs the Kueue integration {integration}")


@pytest.mark.parametrize("kind", ["JobSet", "TrainJob"])
def test_a_gang_larger_than_the_quota_is_refused_for_every_kind(kind: str) -> None:
    config, jobs = rendered(kind, ALL, nodes=3)  # the dev pool holds 2 A10G nodes
    with pytest.raises(ConfigError) as caught:
        check_queueing(config, dev_pools(), "ml-cluster.io", jobs, ["training"])
    [(path, why)] = caught.value.shown()
    assert path == "ml-cluster:jobs[0].gpus" and "the gang (3 pod(s))" in why and "nvidia.com/gpu 3 > 2" in why


def test_a_stack_job_of_a_kind_whose_controller_is_off_is_a_config_error() -> None:
    jobs = [parse_spec({"name": "a", "image": IMAGE, "kind": kind}) for kind in ("Job", "JobSet", "TrainJob")]
    with pytest.raises(ConfigError) as caught:
        check_job_kinds(JobControllersConfig(), jobs)
    assert caught.value.shown() == [
        ("ml-cluster:jobs[1].kind", "JobSet needs its controller: set ml-cluster:jobControllers.jobset.enabled"),
        ("ml-cluster:jobs[2].kind", "TrainJob needs its controller: set ml-cluster:jobControllers.trainer.enabled")]
    check_job_kinds(JobControllersConfig.model_validate({"jobset": {"enabled": True}, "trainer": {"enabled": True}}),
                    jobs)


@pytest.mark.parametrize("kind", ["JobSet", "TrainJob"])
def test_the_capacity_block_check_reads_every_kinds_pod(kind: str) -> None:
    from infra.nodes.blockend import block_end_problems
    from tests.nodepools.test_blockend import job, pools

    manifests = job(kind=kind, gpuType="a10g", terminationGracePeriodSeconds=601)
    [(path, why)] = block_end_problems(pools(), [manifests])
    assert path == "ml-cluster:jobs[0]" and "this Job takes up to 601 s" in why


@pytest.mark.slow
def test_a_stack_with_jobset_and_trainjob_jobs_plans_and_every_object_is_valid(tmp_path: Any) -> None:
    """prod with its multi-node Job as a JobSet and its cached-dataset Job as a TrainJob: the plan registers them
    (the TrainJob's runtime beside it) and the render check validates them against the vendored CRDs."""
    import yaml

    from infra.plan.engine import STACKS_DIR, plan_stack
    from tests.monitoring.crds import render_charts

    raw = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())
    kinds = {"resnet50-ddp": "JobSet", "resnet50-laion": "TrainJob"}
    for spec in raw["config"]["ml-cluster:jobs"]:
        spec["kind"] = kinds[spec["name"]]
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    plan = plan_stack("prod", path)
    types = {r["type"] for r in plan["resources"] if r["name"].startswith("mlc-prod-jobs-resnet50")}
    assert {"kubernetes:jobset.x-k8s.io/v1alpha2:JobSet", "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob",
            "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime"} <= types
    lines = render_charts().check_plan(plan, render_charts().ROOT / "tests" / "charts" / "upstream", "1.35")
    assert all(line.startswith("ok: ") for line in lines), lines
    assert lines[-1] == "ok: custom resources: 16 valid against the charts' CRDs"
