"""Kueue for every controller kind: which LocalQueue a run goes through, and the labels and annotations that put it
there (or, for a held run, that record where `submit start` puts it)."""

from __future__ import annotations

from workloads.cluster_facts import ClusterFacts
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.launcher import LAUNCHER_ANNOTATION
from workloads.jobspec.spec import TrainingJobSpec

# Kueue's Job labels (kubernetes-sigs/kueue v0.19.2 pkg/controller/constants/constants.go:23 and :48).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def queue_annotation(label_prefix: str) -> str:
    """The annotation holding the LocalQueue a held Job joins when `submit start` releases it."""
    return f"{label_prefix}/queue-name"


def job_queue(spec: TrainingJobSpec, facts: ClusterFacts) -> str | None:
    """The Kueue LocalQueue a spec's Job goes through: its own, else the stack's default when the stack runs Kueue."""
    if spec.queue is not None:
        if facts.local_queues is not None and spec.queue not in facts.local_queues:
            known = ", ".join(facts.local_queues) or "none"
            raise JobSpecError("queue", f"{spec.queue} is not a LocalQueue of stack {facts.stack} in namespace "
                                        f"{facts.namespace} (its queues: {known})")
        queue: str | None = spec.queue
    else:
        queue = facts.local_queue if facts.kueue else None
    if spec.workload_priority is not None:
        if queue is None:
            raise JobSpecError("workloadPriority", f"stack {facts.stack} runs no Kueue: a workload priority needs "
                                                   "a queue")
        known_classes = facts.workload_priority_classes
        if known_classes is not None and spec.workload_priority not in known_classes:
            raise JobSpecError("workloadPriority", f"{spec.workload_priority} is not a WorkloadPriorityClass of "
                                                   f"stack {facts.stack} (its classes: "
                                                   f"{', '.join(known_classes) or 'none'})")
    return queue


def queued_metadata(spec: TrainingJobSpec, facts: ClusterFacts,
                    labels: dict[str, str]) -> tuple[dict[str, str], dict[str, str], bool]:
    """(labels, annotations, suspend) of a run's controller object.

    The queue is recorded on every queued run; a held run gets the label only when `submit start` releases it:
    Kueue leaves an object without the label alone (manageJobsWithoutQueueName defaults to false), so it stays
    suspended until its data is in place. A queued run is always created suspended: Kueue unsuspends it when the
    whole gang is admitted.
    """
    object_labels = dict(labels)
    annotations = {"pulumi.com/skipAwait": "true"}
    queue = job_queue(spec, facts)
    held = bool(spec.suspend)
    if queue is not None:
        annotations[queue_annotation(facts.label_prefix)] = queue
        if not held:
            object_labels[KUEUE_QUEUE_LABEL] = queue
        if spec.workload_priority:
            object_labels[KUEUE_PRIORITY_LABEL] = spec.workload_priority
    if spec.launcher == "none":  # the plan and `submit render` note what that costs
        annotations[f"{facts.label_prefix}/{LAUNCHER_ANNOTATION}"] = "none"
    return object_labels, annotations, held or queue is not None
