"""jobset.x-k8s.io/v1alpha2 JobSet: the gang as one unit of restart against one failure budget (the stack installs
the controller: ml-cluster:jobControllers.jobset). Semantics cited from kubernetes-sigs/jobset tag v0.12.0.

One replicated Job per role (`trainer`, replicas 1): an Indexed child Job of `nodes` pods around the same pod
template as the Indexed Job, with the same podFailurePolicy. What differs is who counts:

- the child Job has backoffLimit 0: its first *counted* pod failure (a crash, the OOM killer) fails it with reason
  BackoffLimitExceeded, and the JobSet restarts every child Job (rule `GangFailure`, RestartJobSet), spending one of
  failurePolicy.maxRestarts = the spec's backoffLimit (pkg/controllers/failure_policy.go:225-264: restarts and
  restartsCountTowardsMax += 1; at maxRestarts the JobSet fails with ReachedMaxRestarts). One lost rank costs one
  restart of the gang, counted once, however many pods it took down.
- a config error (exit CONFIG_ERROR_EXIT_CODE) fails the child Job through its FailJob rule, reason PodFailurePolicy,
  and the JobSet fails at once (rule `ConfigError`, FailJobSet, failure_policy.go:214-222); so does a run past
  activeDeadlineSeconds (reason DeadlineExceeded, rule `DeadlineExceeded`).
- a disruption (exit DISRUPTION_EXIT_CODE, or the DisruptionTarget condition of an evicted or preempted pod) is an
  Ignore rule of the child Job's podFailurePolicy: the pod is replaced, the child Job never fails, so no JobSet rule
  is evaluated (jobset_controller.go:189-196 runs the failure policy only for failed child Jobs) and the budget is
  untouched.

Rules match a failed child Job by its Failed condition's reason (`onJobFailureReasons`), first rule first
(failure_policy.go:87-119, ruleIsApplicable :142-164); a failure no rule matches gets RestartJobSet (:45, :69-71).
Restarts are BlockingRecreate: the next formation's pods are created only when the last one's are gone
(jobset_controller.go:920-925), so two formations never share a rendezvous. The controller makes the headless
Service `<jobset>` (jobset_controller.go:793-830, network.enableDNSHostnames) and names pod I of child Job J
`<jobset>-<role>-J-I` (pkg/util/placement/placement.go:14-22): node rank 0 is `<jobset>-trainer-0-0.<jobset>`.
"""

from __future__ import annotations

from typing import Any

from workloads.jobspec.containers import GangAddress
from workloads.jobspec.controllers.indexed_job import COMPLETION_INDEX, pod_failure_policy
from workloads.jobspec.fields import TRAIN_CONTAINER, JobSpecError
from workloads.jobspec.network import job_network_policy
from workloads.jobspec.pod import Manifest, PodTemplate
from workloads.jobspec.queue import queued_metadata
from workloads.jobspec.spec import TrainingJobSpec

API_VERSION, KIND, PLURAL = "jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"
ROLE = "trainer"  # the replicated Job of a plain gang
# Labels the JobSet controller puts on child Jobs and pods (api/jobset/v1alpha2/jobset_types.go:24,32,36).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
# A failed child Job's condition reasons (batch/v1; the reasons JobSet accepts, pkg/webhooks/jobset_webhook.go:85-91).
REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_DEADLINE = "DeadlineExceeded"


def gang_address(run_name: str, namespace: str, role: str = ROLE) -> GangAddress:
    """Pod I of the role's child Job 0 is `<jobset>-<role>-0-I` under the subdomain `<jobset>` (the headless Service
    the controller makes); the child Job is Indexed, so the node rank is its completion index."""
    return GangAddress(master=f"{run_name}-{role}-0-0.{run_name}.{namespace}.svc",
                       node_rank_field=f"metadata.annotations['{COMPLETION_INDEX}']", subdomain=run_name)


def pod_selector(run_name: str) -> str:
    """The label selector of a run's pods (every child Job's)."""
    return f"{JOBSET_NAME_LABEL}={run_name}"


def check_pod_names(spec: TrainingJobSpec, run_name: str, role: str = ROLE) -> None:
    """The webhook refuses a JobSet whose longest pod name `<jobset>-<role>-0-<last index>-xxxxx` is not a DNS-1035
    label (pkg/webhooks/jobset_webhook.go:243-255): say so for the spec's name."""
    longest = f"{run_name}-{role}-0-{spec.nodes - 1}-abcde"
    if len(longest) > 63:
        over = len(longest) - 63
        raise JobSpecError("name", f"{spec.name!r}: {KIND} pods are named <name>-<hash>-{role}-0-<index>-<suffix>, "
                                   f"{len(longest)} characters here; shorten the name by {over}")


def failure_policy(spec: TrainingJobSpec) -> dict[str, Any]:
    """maxRestarts from the spec's budget; rule names as the webhook allows them (jobset_webhook.go:418, no '-')."""
    return {
        "maxRestarts": spec.backoff_limit,
        "restartStrategy": "BlockingRecreate",
        "rules": [
            {"name": "ConfigError", "action": "FailJobSet", "onJobFailureReasons": [REASON_POD_FAILURE_POLICY]},
            {"name": "DeadlineExceeded", "action": "FailJobSet", "onJobFailureReasons": [REASON_DEADLINE]},
            {"name": "GangFailure", "action": "RestartJobSet", "onJobFailureReasons": [REASON_BACKOFF_LIMIT]},
        ],
    }


def container_failure_policy(container: str) -> dict[str, Any]:
    """The Indexed Job's podFailurePolicy, its exit-code rules on the trainer container named `container`."""
    policy = pod_failure_policy()
    for rule in policy["rules"]:
        if "onExitCodes" in rule:
            rule["onExitCodes"]["containerName"] = container
    return policy


def child_job_spec(spec: TrainingJobSpec, template: Manifest, container: str = TRAIN_CONTAINER) -> Manifest:
    """The role's Indexed Job: the Indexed Job's pod rules, its first counted failure handed to the JobSet."""
    job_spec: Manifest = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": 0,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "podFailurePolicy": container_failure_policy(container),
        "podReplacementPolicy": "Failed",
        "template": template,
    }
    if spec.is_elastic():
        # As the Indexed Job: done when index 0 (in every formation) is; JobSet's template carries the batch/v1
        # successPolicy (the CRD's replicatedJobs[].template.spec.successPolicy) and completes on a Complete child.
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    return job_spec


def jobset_spec(pod: PodTemplate, role: str = ROLE, job_labels: dict[str, str] | None = None,
                container: str = TRAIN_CONTAINER) -> Manifest:
    """The JobSet's spec around `pod` (also a ClusterTrainingRuntime's template.spec); `container`: the trainer
    container's name in `pod`."""
    spec = pod.spec
    replicated: Manifest = {"name": role, "replicas": 1,
                            "template": {"spec": child_job_spec(spec, pod.template, container)}}
    if job_labels:
        replicated["template"]["metadata"] = {"labels": dict(job_labels)}
    out: Manifest = {
        "failurePolicy": failure_policy(spec),
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [role]},
        # The headless Service `<jobset>`: peers resolve each other while starting, before any readiness.
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "replicatedJobs": [replicated],
    }
    if spec.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return out


def wrap(pod: PodTemplate) -> list[Manifest]:
    """The JobSet (first) and, for a multi-node gang, its NetworkPolicy (the Service is the controller's)."""
    spec, facts = pod.spec, pod.facts
    check_pod_names(spec, pod.name)
    labels, annotations, suspend = queued_metadata(spec, facts, pod.labels)
    jobset = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pod.name, "namespace": facts.namespace, "labels": labels, "annotations": annotations},
        "spec": {"suspend": suspend, **jobset_spec(pod)},
    }
    manifests: list[Manifest] = [jobset]
    if spec.nodes > 1:
        policy = job_network_policy(spec, facts, pod.name, pod.labels)
        if policy is not None:
            manifests.append(policy)
    return manifests
