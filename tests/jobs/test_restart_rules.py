"""Every restart rule of a rendered training Job: which failures fail it, which are retried without spending
backoffLimit, which count; how a gang restarts as a whole; the grace period a last checkpoint gets."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.gang import COUNT, FAIL_JOB, IGNORE, pod_failure_action
from tests.jobs.facts import dev_facts, prod_facts
from tests.jobs.jobrules import check_job, validate_strict
from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE, parse_spec, render_job
from workloads.jobspec.fields import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_ELASTIC_WAIT_S,
    DEFAULT_RANK_RESTARTS,
    NODE_LOST_TOLERATION_S,
    RENDEZVOUS_JOIN_TIMEOUT_S,
    STOP_BASE_S,
    STOP_MARGIN_S,
)
from workloads.train import __main__ as trainer

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"


def _job(**fields: Any) -> dict[str, Any]:
    job, *_ = render_job(parse_spec({"name": "resnet", "image": IMAGE, **fields}),
                         prod_facts() if fields.get("nodes", 1) > 1 else dev_facts())
    return job


def _gang(**fields: Any) -> dict[str, Any]:
    return _job(**{"nodes": 2, "gpus": 8, "gpuType": "h100", **fields})


def _env(job: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("job", [_job(), _gang()], ids=["single", "gang"])
@pytest.mark.parametrize(("exit_code", "conditions", "action"), [
    (CONFIG_ERROR_EXIT_CODE, (), FAIL_JOB),  # retrying cannot help
    (DISRUPTION_EXIT_CODE, (), IGNORE),  # SIGTERM after a last checkpoint, or a lost peer
    (137, ("DisruptionTarget",), IGNORE),  # drained, preempted, evicted from a lost node: SIGKILL after the grace
    (None, ("DisruptionTarget",), IGNORE),  # the node vanished (pod garbage-collected)
    (1, (), COUNT),  # a crash
    (137, (), COUNT),  # the OOM killer
    (2, (), COUNT),
])
def test_pod_failure_policy_rule(job: dict[str, Any], exit_code: int | None, conditions: tuple[str, ...],
                                 action: str) -> None:
    assert pod_failure_action(job, "train", exit_code, conditions) == action


def test_trainer_and_job_agree_on_the_codes() -> None:
    assert trainer.DISRUPTION_EXIT_CODE == DISRUPTION_EXIT_CODE
    assert len({CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE, trainer.RUNTIME_EXIT_CODE}) == 3
    env = _env(_job())
    assert env["CONFIG_ERROR_EXIT_CODE"] == str(CONFIG_ERROR_EXIT_CODE)
    assert env["DISRUPTION_EXIT_CODE"] == str(DISRUPTION_EXIT_CODE)


@pytest.mark.parametrize("job", [_job(), _gang()], ids=["single", "gang"])
def test_a_replacement_pod_waits_for_the_old_one_to_stop(job: dict[str, Any]) -> None:
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    validate_strict(job, "1.35")


def test_a_gang_restarts_as_a_whole_through_torchrun_with_finite_waits() -> None:
    job = _gang()
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "workloads.train.launch", "--module", "workloads.train"]
    env = _env(job)
    assert env["PET_MAX_RESTARTS"] == str(DEFAULT_RANK_RESTARTS)
    assert env["PET_RDZV_CONF"] == f"join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S}"
    assert env["COLLECTIVE_TIMEOUT_SECONDS"] == str(DEFAULT_COLLECTIVE_TIMEOUT_S)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # from the fabric, once
    assert [item["name"] for item in container["env"]].count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 1
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(pod["terminationGracePeriodSeconds"] - STOP_MARGIN_S)
    lost = [t for t in pod["tolerations"] if t["key"].startswith("node.kubernetes.io/")]
    assert {t["key"] for t in lost} == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert all(t == {"key": t["key"], "operator": "Exists", "effect": "NoExecute",
                     "tolerationSeconds": NODE_LOST_TOLERATION_S} for t in lost)
    check_job(job, kubernetes_version="1.35")
    assert DEFAULT_RANK_RESTARTS == 0  # every pod exits and is replaced: the fast path the harness measured
    tuned = _env(_gang(rankRestarts=2, collectiveTimeoutSeconds=300))
    assert tuned["PET_MAX_RESTARTS"] == "2" and tuned["COLLECTIVE_TIMEOUT_SECONDS"] == "300"


def test_an_elastic_gang_renders_min_max_nodes_the_wait_and_success_by_index_0() -> None:
    # 192 samples a step on 2, 3 or 4 nodes of 8 GPUs: 12, 8 or 6 per GPU
    job = _gang(nodes=4, minNodes=2, elasticWaitSeconds=120, args=["--global-batch-size", "192"])
    env = _env(job)
    assert env["PET_NNODES"] == "2:4"  # torchrun MIN:MAX
    assert env["PET_RDZV_CONF"] == f"join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S},last_call_timeout=120"
    # the Job stays an Indexed gang of the largest size: Kueue admits (and quota holds) all 4
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    # an index that never ran (its pod Pending) does not keep the finished Job open: index 0 decides
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    check_job(job, kubernetes_version="1.35")
    assert _env(_gang(minNodes=1, args=["--global-batch-size", "64"]))["PET_RDZV_CONF"].endswith(
        f"last_call_timeout={DEFAULT_ELASTIC_WAIT_S}")
    # minNodes == nodes is a rigid gang, as without minNodes
    rigid = _gang(minNodes=2)
    assert _env(rigid)["PET_NNODES"] == "2" and "successPolicy" not in rigid["spec"]
    assert "successPolicy" not in _gang()["spec"]


@pytest.mark.parametrize(("fields", "where", "why"), [
    ({"nodes": 1, "minNodes": 1}, "minNodes", "nodes >= 2"),
    ({"nodes": 2, "minNodes": 3}, "minNodes", "more than nodes"),
    ({"nodes": 2, "minNodes": 1}, "args", "--global-batch-size"),
    ({"nodes": 2, "minNodes": 1, "args": ["--global-batch-size", "many"]}, "args", "--global-batch-size"),
    # 8 GPUs a node: 1 x 8 divides 24, 2 x 8 does not
    ({"nodes": 2, "minNodes": 1, "args": ["--global-batch-size=24"]}, "args", "not divisible by 2 nodes x 8"),
    ({"nodes": 2, "minNodes": 1, "elasticWaitSeconds": RENDEZVOUS_JOIN_TIMEOUT_S,
      "args": ["--global-batch-size", "64"]}, "elasticWaitSeconds", ""),
    ({"nodes": 2, "elasticWaitSeconds": 60}, "elasticWaitSeconds", "set minNodes too"),
])
def test_elastic_gang_spec_errors_name_the_field(fields: dict[str, Any], where: str, why: str) -> None:
    with pytest.raises(ValueError, match=where) as raised:
        parse_spec({"name": "resnet", "image": IMAGE, "gpus": 8, "gpuType": "h100", **fields})
    assert why in str(raised.value)


def test_an_elastic_gang_of_your_own_trainer_keeps_its_own_batch_rule() -> None:
    job = _gang(minNodes=1, command=["python", "train.py"])
    assert _env(job)["PET_NNODES"] == "1:2"


def test_a_users_own_node_toleration_wins() -> None:
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
           "tolerationSeconds": 600}
    pod = _gang(tolerations=[own])["spec"]["template"]["spec"]
    assert [t for t in pod["tolerations"] if t["key"] == own["key"]] == [own]


def test_single_node_jobs_run_the_trainer_and_multi_gpu_ones_the_launcher() -> None:
    job = _job()
    assert "command" not in job["spec"]["template"]["spec"]["containers"][0]
    assert "PET_MAX_RESTARTS" not in _env(job) and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in _env(job)
    multi_gpu, = render_job(parse_spec({"name": "resnet", "image": IMAGE, "gpus": 4, "gpuType": "a100"}),
                            prod_facts())
    assert multi_gpu["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["python", "-m",
                                                                                    "workloads.train.launch"]
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in _env(multi_gpu)


@pytest.mark.parametrize(("checkpoint", "grace"), [
    (None, STOP_BASE_S),
    ({"claimName": "checkpoints-efs", "size": "10Gi"}, STOP_BASE_S + 103),  # 10Gi at 100Mi/s: 102.4 s
    ({"uri": "s3://mlc-dev-ckpt/run", "size": "10Gi"}, STOP_BASE_S + 205),  # written, then uploaded
    ({"uri": "s3://mlc-dev-ckpt/run", "size": "10Gi", "writeRate": "1Gi"}, STOP_BASE_S + 20),
])
def test_grace_period_is_sized_from_the_checkpoint(checkpoint: dict[str, Any] | None, grace: int) -> None:
    fields = {} if checkpoint is None else {"checkpoint": checkpoint}
    job = _job(**fields)
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    assert _job(**fields, terminationGracePeriodSeconds=900)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"] == 900
