"""What the JobSet and Kubeflow Trainer controllers do with the objects this project renders, modelled from their
source at the pinned tags (kubernetes-sigs/jobset v0.12.0, kubeflow/trainer v2.3.0), for tests that cannot run the
controllers: the failure-policy rule a failed child Job matches, and the pod Trainer makes of a TrainJob on its
runtime. The batch/v1 Job controller's podFailurePolicy is modelled by benchmarks.gang.pod_failure_action."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

# jobset pkg/controllers/failure_policy.go:45: a failure no rule matches gets RestartJobSet.
DEFAULT_ACTION = "RestartJobSet"
# The actions that recreate every child Job, and whether they spend one of maxRestarts (failure_policy.go:225-297:
# RestartJobSet increments restarts and restartsCountTowardsMax, RestartJobSetAndIgnoreMaxRestarts only restarts).
COUNTS_TOWARDS_MAX = {"RestartJobSet": True, "RestartJobSetAndIgnoreMaxRestarts": False}
# pkg/webhooks/jobset_webhook.go:85-91 and :418: the reasons a rule may name, and a rule name's form.
VALID_REASONS = {"BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                 "PodFailurePolicy"}
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class JobSetOutcome:
    rule: str | None  # the matching rule's name; None: no rule (the default action)
    action: str
    restarts: int  # status.restarts after it
    counted: int  # status.restartsCountTowardsMax after it
    failed: bool  # the JobSet's Failed condition set


def failure_policy_outcome(jobset: dict[str, Any], reason: str, replicated_job: str, message: str = "",
                           restarts: int = 0, counted: int = 0) -> JobSetOutcome:
    """One failed child Job of `replicated_job` with Failed condition `reason`: the first rule (in order) whose
    reasons, message patterns and target replicated Jobs all match (failure_policy.go:87-119, ruleIsApplicable
    :142-164, empty lists match everything), then its action (:214-297; RestartJobSet at maxRestarts fails the JobSet
    with ReachedMaxRestarts, :226-233)."""
    policy = jobset["spec"].get("failurePolicy")
    if policy is None:  # failure_policy.go:52-62: no policy, the first failure fails the JobSet
        return JobSetOutcome(None, "FailJobSet", restarts, counted, True)
    matched = None
    for rule in policy.get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if patterns and not any(re.search(pattern, message) for pattern in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        matched = rule
        break
    action = matched["action"] if matched is not None else DEFAULT_ACTION
    name = matched["name"] if matched is not None else None
    if action == "FailJobSet":
        return JobSetOutcome(name, action, restarts, counted, True)
    if action == "RestartJobSet" and counted >= policy.get("maxRestarts", 0):
        return JobSetOutcome(name, action, restarts, counted, True)  # ReachedMaxRestarts
    return JobSetOutcome(name, action, restarts + 1, counted + int(COUNTS_TOWARDS_MAX.get(action, False)), False)


NODE = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_PORT = 29500  # pkg/constants/constants.go ContainerTrainerPort


def _upsert(env: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """pkg/apply/apply.go:79-87: replace the variable of that name in place, else append."""
    for index, existing in enumerate(env):
        if existing["name"] == item["name"]:
            env[index] = item
            return
    env.append(item)


def trainer_jobset_spec(train_job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet spec Trainer builds of `train_job` on `runtime` (torch runtimes): the runtime's template.spec
    (plugins/jobset/jobset.go:344-417), the trainer Job's pod count from numNodes (plugins/torch/torch.go:116-119,
    jobset.go:316-317), the `node` container's image, command and args from the TrainJob (builder.go:113-140), the
    TrainJob's env upserted (builder.go:141-153, torch.go:138-143), then PET_NNODES, PET_NPROC_PER_NODE,
    PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT upserted (torch.go:145-177)."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    trainer = train_job["spec"].get("trainer")
    name = train_job["metadata"]["name"]
    for rjob in spec["replicatedJobs"]:
        if ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        rjob["replicas"] = 1
        job_spec = rjob["template"]["spec"]
        nodes = (trainer or {}).get("numNodes", job_spec.get("parallelism", 1))
        job_spec["parallelism"] = job_spec["completions"] = nodes
        if trainer is None:  # torch.go:137-140: no trainer, nothing injected
            continue
        for container in job_spec["template"]["spec"]["containers"]:
            if container["name"] != NODE:
                continue
            for key in ("image", "command", "args"):
                if trainer.get(key) is not None:
                    container[key] = trainer[key]
            env = container.setdefault("env", [])
            for item in trainer.get("env", []):
                _upsert(env, item)
            gpus = int((container.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu", 0))
            procs = trainer.get("numProcPerNode", "auto" if gpus else 1)
            for item in ({"name": "PET_NNODES", "value": str(nodes)},
                         {"name": "PET_NPROC_PER_NODE", "value": str(procs)},
                         {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                             "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                         {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
                         {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}):
                _upsert(env, item)
    return spec
