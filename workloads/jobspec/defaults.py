"""The pod defaults every pod this project renders shares: the training gang's (workloads.jobspec.pod), the dataset
pack's (workloads.jobspec.packjob) and the GPU burn-in's (infra/nodes/burnin.py). Written once, here.

- labels: app.kubernetes.io/{name,instance,component,part-of,managed-by} and the stack label;
- security: the restricted container context (no privilege escalation, every capability dropped, non-root, the
  runtime's seccomp profile) and the pod context (the image's non-root user and group, fsGroup);
- placement: `Exists` tolerations, the GPU taint's, the health gate's required node affinity;
- the writable /tmp (HOME moves there), metrics endpoints on every interface, the image pull policy.
"""

from __future__ import annotations

from typing import Any

from workloads.health.verdict import HEALTH_LABEL, PASSED
from workloads.jobspec.fields import RUN_AS_UID, TMP_DIR

PART_OF = "ml-cluster"
SECCOMP_RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
GPU_TAINT = "nvidia.com/gpu"

# HOME moves to the writable /tmp: Python, torch and boto3 write caches and config under it.
HOME_ENV = {"name": "HOME", "value": TMP_DIR}
# Metrics endpoints listen on every interface of the pod (their default is loopback); the namespace's NetworkPolicy
# admits only the monitoring namespace to these ports.
METRICS_ADDR_ENV = {"name": "METRICS_ADDR", "value": "0.0.0.0"}
TMP_VOLUME = "tmp"
TMP_MOUNT = {"name": TMP_VOLUME, "mountPath": TMP_DIR}


def stack_labels(stack: str, label_prefix: str, managed_by: str = "ml-cluster") -> dict[str, str]:
    """Whose an object is and which stack's: part-of, managed-by and `<prefix>/stack`, in that order."""
    return {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": managed_by,
            f"{label_prefix}/stack": stack}


def app_labels(name: str, component: str, stack: str, label_prefix: str, *, instance: str | None = None,
               managed_by: str = "ml-cluster") -> dict[str, str]:
    """name, instance (when given), component, then the stack labels, in that order."""
    labels = {"app.kubernetes.io/name": name}
    if instance is not None:
        labels["app.kubernetes.io/instance"] = instance
    return {**labels, "app.kubernetes.io/component": component, **stack_labels(stack, label_prefix, managed_by)}


def restricted_container(read_only_root: bool = True) -> dict[str, Any]:
    """A container's security context under Pod Security `restricted`."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT),
    }


def restricted_pod() -> dict[str, Any]:
    """The pod's security context: the image's non-root user (workloads/Dockerfile) owns what it writes."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_UID,
        "runAsGroup": RUN_AS_UID,
        "fsGroup": RUN_AS_UID,
        "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT),
    }


def run_once_pod(service_account: str, grace_seconds: int) -> dict[str, Any]:
    """The start of a batch pod's spec: runs once, and holds no API token (EKS Pod Identity's own projected token
    volume, with the pods.eks.amazonaws.com audience, still arrives through its webhook) and no service links."""
    return {
        "restartPolicy": "Never",
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_seconds,
    }


def tolerate(key: str, effect: str = "NoSchedule", seconds: int | None = None) -> dict[str, Any]:
    """Tolerate taint `key` whatever its value (for `seconds` on a NoExecute taint, when given)."""
    toleration: dict[str, Any] = {"key": key, "operator": "Exists", "effect": effect}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    return toleration


def pull_policy(image: str) -> str:
    """A digest never changes: the node's copy is the image. A tag may be re-pointed: ask the registry each time."""
    return "IfNotPresent" if "@sha256:" in image else "Always"


def required_node_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    """A required node affinity of one term with these match expressions."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": list(expressions)}]}}}


def health_gate_label(label_prefix: str) -> tuple[str, str]:
    """The label the gate requires and the burn-in sets: (`<prefix>/gpu-health`, `passed`)."""
    return f"{label_prefix}/{HEALTH_LABEL}", PASSED


def gpu_health_affinity(label_prefix: str) -> dict[str, Any]:
    """Only nodes the GPU burn-in passed (workloads/health/verdict.py): an unchecked node has no label, a failed
    one `failed`. Required at scheduling, so a node that fails later keeps its running pods (its taint is
    NoSchedule); the burn-in never re-labels a node in service."""
    key, passed = health_gate_label(label_prefix)
    return required_node_affinity({"key": key, "operator": "In", "values": [passed]})
