"""The same Job spec as an Indexed Job, a JobSet and a TrainJob on its runtime: the same pod field by field, every
JobSet / TrainJob / (Cluster)TrainingRuntime valid strictly against the vendored CRDs, and the restart rules per
disruption of the chaos harness against JobSet's failurePolicy semantics (tests/controllers/upstream.py)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.gang import COUNT, FAIL_JOB, IGNORE, pod_failure_action
from tests.controllers.upstream import RULE_NAME, VALID_REASONS, failure_policy_outcome, trainer_jobset_spec
from tests.jobs.facts import dev_facts, prod_facts
from tests.monitoring.crds import controller_crds
from tests.monitoring.crds import render_charts as render_charts_module
from workloads.cluster_facts import ClusterFacts
from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE, JobSpecError, parse_spec, render_job
from workloads.jobspec.runtimes import StagedRuntime, plain_runtimes, staged_runtime

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ml-cluster-train:0.1.0"
render_charts = render_charts_module()


def prod_example(name: str = "resnet50-ddp") -> dict[str, Any]:
    """A Job spec of prod's stack file (resnet50-ddp: 2 p5 nodes x 8 H100, its dataset copied from FSx for Lustre onto
    NVMe, checkpoints on FSx)."""
    jobs = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())["config"]["ml-cluster:jobs"]
    return dict(next(job for job in jobs if job["name"] == name))


def efa_prod_facts() -> ClusterFacts:
    """prod's facts with the p5 pool's 32 EFA interfaces (its plan's facts have them: efa: true)."""
    facts = prod_facts()
    pools = tuple(replace(pool, efa_interfaces=32) if pool.gpu_type == "h100" else pool for pool in facts.pools)
    return replace(facts, gpu_health_gate=True, pools=pools)


def render(kind: str, **fields: Any) -> list[dict[str, Any]]:
    raw = {**prod_example(), **fields, "kind": kind}
    return render_job(parse_spec(raw), efa_prod_facts() if raw.get("gpuType") == "h100" else dev_facts())


def assert_valid(manifest: dict[str, Any]) -> None:
    problems = render_charts.validate_custom(manifest, controller_crds())
    assert not problems, f"{manifest['kind']}/{manifest['metadata']['name']}: {problems[:3]}"


# --- the same pod -------------------------------------------------------------------------------------------------


def _normalised(value: Any, run_name: str) -> Any:
    """The run's name (the spec's hash differs per kind) as RUN."""
    return json.loads(json.dumps(value).replace(run_name, "RUN"))


def pods_three_ways(**fields: Any) -> dict[str, dict[str, Any]]:
    job, *_ = render("Job", **fields)
    jobset, *_ = render("JobSet", **fields)
    train_job, runtime, *_ = render("TrainJob", **fields)
    built = trainer_jobset_spec(train_job, runtime)  # what Trainer makes of them
    return {
        "Job": _normalised(job["spec"]["template"], job["metadata"]["name"]),
        "JobSet": _normalised(jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
                              jobset["metadata"]["name"]),
        "TrainJob": _normalised(built["replicatedJobs"][0]["template"]["spec"]["template"],
                                train_job["metadata"]["name"]),
    }


# Where each controller puts node rank 0 (and nothing else differs): the Indexed Job's pod `<job>-0`, the JobSet's
# `<jobset>-<role>-0-0` (jobset pkg/util/placement/placement.go:14-22).
RANK0 = {"Job": "RUN-0.RUN.training.svc", "JobSet": "RUN-trainer-0-0.RUN.training.svc",
         "TrainJob": "RUN-node-0-0.RUN.training.svc"}
# Trainer appends these to the `node` container (torch.go:152-166); torchrun ignores them with the c10d backend.
TRAINER_ONLY = {"PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
POD_FIELDS = ("volumes", "initContainers", "nodeSelector", "affinity", "tolerations", "securityContext",
              "serviceAccountName", "restartPolicy", "terminationGracePeriodSeconds", "subdomain",
              "priorityClassName")
CONTAINER_FIELDS = ("image", "imagePullPolicy", "command", "args", "resources", "securityContext", "volumeMounts",
                    "ports", "envFrom")


@pytest.mark.parametrize("fields", [{}, {"nodes": 1, "gpus": 2}, {"nodes": 3}],
                         ids=["prod-multi-node", "single-node-no-data", "three-nodes"])
def test_the_same_spec_gives_the_same_pod_as_indexed_job_jobset_and_trainjob(fields: dict[str, Any]) -> None:
    raw = {**prod_example(), **fields}
    if raw["nodes"] == 1:
        raw.pop("dataset"), raw.pop("checkpoint")
    pods = pods_three_ways(**raw)
    job_pod = pods["Job"]
    assert job_pod["metadata"] == pods["JobSet"]["metadata"] == pods["TrainJob"]["metadata"]
    for kind in ("JobSet", "TrainJob"):
        pod = pods[kind]
        for field in POD_FIELDS:
            assert pod["spec"].get(field) == job_pod["spec"].get(field), f"{kind}: spec.{field}"
        assert len(pod["spec"]["containers"]) == len(job_pod["spec"]["containers"]) == 1
        [ours], [theirs] = pod["spec"]["containers"], job_pod["spec"]["containers"]
        assert ours["name"] == ("node" if kind == "TrainJob" else "train")  # Trainer's container name
        for field in CONTAINER_FIELDS:
            assert ours.get(field) == theirs.get(field), f"{kind}: containers[0].{field}"
        expected = [dict(item) for item in theirs["env"]]
        for item in expected:
            if raw["nodes"] > 1 and item["name"] in ("MASTER_ADDR", "PET_RDZV_ENDPOINT"):
                item["value"] = item["value"].replace(RANK0["Job"], RANK0[kind])
        # single node: Trainer adds PET_NNODES=1 beside the pod's PET_STANDALONE (torch.go:145-148)
        trainer_only = TRAINER_ONLY | ({"PET_NNODES"} if raw["nodes"] == 1 else set())
        env = [item for item in ours["env"] if kind != "TrainJob" or item["name"] not in trainer_only]
        assert env == expected, kind  # env, in order, value by value
        if kind == "TrainJob" and raw["nodes"] > 1:
            trainer_env = {item["name"]: item.get("value") for item in ours["env"]}
            assert trainer_env["PET_NNODES"] == str(raw["nodes"]) and trainer_env["PET_NPROC_PER_NODE"] == "8"
            assert f"{trainer_env['PET_MASTER_ADDR']}.training.svc" == RANK0["TrainJob"]


# The dataset staged from S3 by the cache sidecar (prod's resnet50-ddp before it read from FSx for Lustre).
CACHED = {"bucket": "datasets", "prefix": "imagenet-hdf5/", "mountPath": "/data/imagenet", "staging": "cache",
          "stagedSize": "150Gi"}


def test_the_pod_of_the_staged_prod_example_has_every_fragment() -> None:
    """The fields compared above are not empty: the JobSet's pod has the stager sidecar, EFA, hugepages, /dev/shm,
    the health gate and the metrics ports."""
    jobset, *_ = render("JobSet", dataset=CACHED)
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    [stage] = pod["initContainers"]
    assert stage["name"] == "stage" and stage["restartPolicy"] == "Always"
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and "vpc.amazonaws.com/efa" in limits
    assert any(key.startswith("hugepages-") for key in limits)
    shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm and shm[0]["emptyDir"]["sizeLimit"] == "64Gi"
    assert pod["affinity"]["nodeAffinity"]  # the GPU health gate
    assert [p["containerPort"] for p in pod["containers"][0]["ports"]][:2] == [9450, 9451]


# --- strict validation against the vendored CRDs ------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {}, {"nodes": 1, "gpus": 1, "gpuType": "a10g", "dataset": None, "checkpoint": None, "shmSize": "8Gi"},
    {"minNodes": 1, "args": ["--global-batch-size", "512"]}, {"ttlSecondsAfterFinished": 3600, "suspend": True},
], ids=["prod-multi-node", "dev-single", "elastic", "held-ttl"])
def test_every_rendered_jobset_and_trainjob_is_valid_against_the_crds(fields: dict[str, Any]) -> None:
    fields = {k: v for k, v in fields.items()}
    raw = {**prod_example(), **fields}
    for key in ("dataset", "checkpoint"):
        if raw.get(key) is None:
            raw.pop(key, None)
    facts = efa_prod_facts() if raw.get("gpuType") == "h100" else dev_facts()
    jobset = render_job(parse_spec({**raw, "kind": "JobSet"}), facts)[0]
    assert_valid(jobset)
    for rule in jobset["spec"]["failurePolicy"]["rules"]:  # what the webhook checks beyond the schema
        assert RULE_NAME.match(rule["name"]) and set(rule["onJobFailureReasons"]) <= VALID_REASONS
    if raw.get("minNodes"):
        with pytest.raises(JobSpecError, match="minNodes: a TrainJob cannot be elastic"):
            render_job(parse_spec({**raw, "kind": "TrainJob"}), facts)
        return
    train_job, runtime, *_ = render_job(parse_spec({**raw, "kind": "TrainJob"}), facts)
    assert_valid(train_job)
    assert_valid(runtime)
    assert train_job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                               "name": runtime["metadata"]["name"]}


def test_a_schema_violation_is_caught() -> None:
    jobset = copy.deepcopy(render("JobSet")[0])
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["gpu"] = 1
    problems = render_charts.validate_custom(jobset, controller_crds())
    assert any("'Retry' is not one of" in p for p in problems)
    assert any("'gpu' was unexpected" in p for p in problems)


def test_the_cluster_training_runtimes_are_valid_and_built_from_the_job_pod() -> None:
    facts = prod_facts()
    runtimes = plain_runtimes(facts, {"image": IMAGE})
    assert [r["metadata"]["name"] for r in runtimes] == ["torch-distributed-a100", "torch-distributed-h100"]
    dataset = {"bucket": "datasets", "prefix": "imagenet-hdf5/", "mountPath": "/data/imagenet", "staging": "cache",
               "stagedSize": "150Gi"}
    staged = staged_runtime(facts, {"image": IMAGE}, StagedRuntime("imagenet-h100-staged", "h100", dataset))
    for runtime in [*runtimes, staged]:
        assert_valid(runtime)
        [rjob] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        assert rjob["name"] == "node"
        assert rjob["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
        [node] = rjob["template"]["spec"]["template"]["spec"]["containers"]
        env = [item["name"] for item in node["env"]]
        # Trainer's variables first, so $(PET_MASTER_ADDR) in the rendezvous endpoint expands
        assert env[:3] == ["TRAINJOB_NAME", "PET_MASTER_ADDR", "PET_MASTER_PORT"]
        values = {item["name"]: item.get("value") for item in node["env"]}
        assert values["PET_RDZV_ENDPOINT"] == "$(PET_MASTER_ADDR):29500"
        assert values["PET_RDZV_BACKEND"] == "c10d"
    stage = staged["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in stage["initContainers"]] == ["stage"]
    # The runtime's pod is the Job's pod of the same spec: compare the h100 runtime with a 2-node h100 Job.
    job = render_job(parse_spec({"name": "torch-distributed-h100", "image": IMAGE, "gpus": 8, "gpuType": "h100",
                                 "nodes": 2}), facts)[0]
    runtime_pod = runtimes[1]["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    job_pod = job["spec"]["template"]
    for field in ("volumes", "nodeSelector", "affinity", "tolerations", "securityContext"):
        assert runtime_pod["spec"].get(field) == job_pod["spec"].get(field), field
    assert runtime_pod["spec"]["containers"][0]["resources"] == job_pod["spec"]["containers"][0]["resources"]


def test_trainjob_example_is_valid_and_names_a_shipped_runtime() -> None:
    example = yaml.safe_load((ROOT / "examples" / "kubeflow" / "plain-pytorch-trainjob.yaml").read_text())
    assert_valid(example)
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.staging.yaml").read_text())["config"]
    assert stack["ml-cluster:jobControllers"]["trainer"]["enabled"]
    assert example["spec"]["runtimeRef"]["name"].startswith("torch-distributed-")
    assert example["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"


# --- the restart rules per disruption ------------------------------------------------------------------------------

# Each disruption of the chaos harness (benchmarks/chaos_gang.py) as the pods it leaves: (the pod's trainer exit code
# or None, its pod conditions) for the disrupted pod and for its peer, whose collective fails (exit 43).
DISRUPTIONS = {
    "SIGKILL": [(137, ("DisruptionTarget",)), (DISRUPTION_EXIT_CODE, ())],  # a lost node: evicted, SIGKILLed
    "SIGTERM": [(DISRUPTION_EXIT_CODE, ()), (DISRUPTION_EXIT_CODE, ())],  # drain or Spot notice: last checkpoint
    "DROP": [(None, ("DisruptionTarget",)), (DISRUPTION_EXIT_CODE, ())],  # node gone for good, replacement Pending
}
# (child Job podFailurePolicy action per pod, child Job failure reason or None, JobSet rule, budget spent)
RULE_TABLE = {
    "SIGKILL": ([IGNORE, IGNORE], None, None, 0),
    "SIGTERM": ([IGNORE, IGNORE], None, None, 0),
    "DROP": ([IGNORE, IGNORE], None, None, 0),
    "crash": ([COUNT], "BackoffLimitExceeded", "GangFailure", 1),
    "config error": ([FAIL_JOB], "PodFailurePolicy", "ConfigError", 0),
}
OTHERS = {"crash": [(1, ())], "config error": [(CONFIG_ERROR_EXIT_CODE, ())]}


def child_job_reason(child: dict[str, Any], actions: list[str]) -> str | None:
    """The batch/v1 Job controller: FailJob fails the Job (reason PodFailurePolicy); Ignore neither counts nor
    fails; a Count beyond backoffLimit fails it with BackoffLimitExceeded."""
    if FAIL_JOB in actions:
        return "PodFailurePolicy"
    if actions.count(COUNT) > child["backoffLimit"]:
        return "BackoffLimitExceeded"
    return None


@pytest.mark.parametrize("kind", ["JobSet", "TrainJob"])
@pytest.mark.parametrize("disruption", list(RULE_TABLE))
def test_rule_table_per_disruption(kind: str, disruption: str) -> None:
    """For each disruption: the child Job's podFailurePolicy rule per pod, whether the child Job fails, which JobSet
    failurePolicy rule matches (JobSet runs its failure policy only for failed child Jobs, jobset_controller.go:
    189-196), and whether a restart counts towards maxRestarts (the spec's backoffLimit)."""
    if kind == "JobSet":
        jobset = render("JobSet")[0]
    else:
        train_job, runtime, *_ = render("TrainJob")
        jobset = {"spec": trainer_jobset_spec(train_job, runtime)}
    [rjob] = jobset["spec"]["replicatedJobs"]
    child = rjob["template"]["spec"]
    container = child["template"]["spec"]["containers"][0]["name"]
    pods = DISRUPTIONS.get(disruption) or OTHERS[disruption]
    actions = [pod_failure_action({"spec": child}, container, code, conditions) for code, conditions in pods]
    want_actions, want_reason, want_rule, want_spent = RULE_TABLE[disruption]
    assert actions == want_actions
    reason = child_job_reason(child, actions)
    assert reason == want_reason
    if reason is None:
        return  # the child Job never fails: no JobSet rule is evaluated, nothing spent
    outcome = failure_policy_outcome(jobset, reason, rjob["name"])
    assert outcome.rule == want_rule
    assert outcome.counted == want_spent
    assert outcome.failed == (disruption == "config error")


def test_the_budget_is_the_specs_backoff_limit_counted_once_per_gang_failure() -> None:
    jobset = render("JobSet", backoffLimit=2)[0]
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 2
    counted, restarts = 0, 0
    for _ in range(2):  # two crashes: two gang restarts, each counted once
        outcome = failure_policy_outcome(jobset, "BackoffLimitExceeded", "trainer", restarts=restarts, counted=counted)
        assert not outcome.failed and outcome.action == "RestartJobSet"
        counted, restarts = outcome.counted, outcome.restarts
    assert (counted, restarts) == (2, 2)
    assert failure_policy_outcome(jobset, "BackoffLimitExceeded", "trainer", restarts=2, counted=2).failed
    deadline = failure_policy_outcome(jobset, "DeadlineExceeded", "trainer")
    assert deadline.rule == "DeadlineExceeded" and deadline.failed


def test_jobset_pod_names_must_fit_a_dns_label() -> None:
    with pytest.raises(JobSpecError, match="name: .*shorten the name by"):
        render("JobSet", name="a" * 40, nodes=16)
