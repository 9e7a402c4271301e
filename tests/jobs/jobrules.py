"""The rules every rendered training Job must keep ("Done when" of the Jobs capability), as one checker.

Used on specs rendered in unit tests and on the Jobs of every stack's offline plan.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

from infra.plan.kubeschema import validate
from tests.jobs.pss import restricted_violations
from workloads.jobspec import CONFIG_ERROR_EXIT_CODE
from workloads.quantity import quantity_bytes

HASHED_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{8}$")


def validate_strict(manifest: dict[str, Any], kubernetes_version: str = "1.33") -> None:
    """Strict schema validation; raise AssertionError with the first line of the validator's message."""
    try:
        validate(manifest, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        first = str(exc).splitlines()[0]
        raise AssertionError(f"{manifest['kind']}/{manifest['metadata'].get('name')}: {first}") from None


def memory_backed_bytes(pod_spec: dict[str, Any]) -> int:
    return sum(quantity_bytes(volume["emptyDir"]["sizeLimit"]) for volume in pod_spec.get("volumes", [])
               if (volume.get("emptyDir") or {}).get("medium") == "Memory")


def check_job(job: dict[str, Any], label_prefix: str = "ml-cluster.io",
              kubernetes_version: str = "1.33") -> None:
    """Assert every Job rule on one batch/v1 Job manifest."""
    name = job["metadata"]["name"]
    assert HASHED_NAME.match(name) and len(name) <= 63, f"{name}: not <spec-name>-<8 hex hash>"
    assert job["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true", name
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never", name
    template_annotations = spec["template"]["metadata"].get("annotations", {})
    assert template_annotations.get("cluster-autoscaler.kubernetes.io/safe-to-evict") == "false", name
    for key in ("backoffLimit", "activeDeadlineSeconds"):
        assert isinstance(spec.get(key), int), f"{name}: {key} missing"
    rules = spec["podFailurePolicy"]["rules"]
    assert any(rule["action"] == "FailJob" and CONFIG_ERROR_EXIT_CODE in rule["onExitCodes"]["values"]
               for rule in rules), f"{name}: no FailJob on the config-error exit code"
    assert any(rule["action"] == "Ignore"
               and rule.get("onPodConditions", [{}])[0].get("type") == "DisruptionTarget"
               for rule in rules), f"{name}: disruptions are not ignored"

    containers = pod["containers"] + pod.get("initContainers", [])
    for container in containers:
        resources = container["resources"]  # requests == limits everywhere: GPU rule, Guaranteed QoS
        assert resources["limits"] == resources["requests"], f"{name}/{container['name']}: requests != limits"
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        assert security["seccompProfile"]["type"] == "RuntimeDefault", name
    assert not any("hostPath" in volume for volume in pod.get("volumes", [])), f"{name}: hostPath volume"
    assert restricted_violations(pod) == [], f"{name}: breaks Pod Security restricted"
    assert pod["automountServiceAccountToken"] is False, f"{name}: Kubernetes API token mounted"
    for container in containers:
        assert container["imagePullPolicy"] in ("Always", "IfNotPresent"), name
        if container["securityContext"].get("readOnlyRootFilesystem"):
            writable = {mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")}
            assert "/tmp" in writable, f"{name}/{container['name']}: read-only root without a writable /tmp"

    train = pod["containers"][0]
    limits, requests = train["resources"]["limits"], train["resources"]["requests"]
    assert limits == requests, f"{name}: train container requests != limits"
    gpus = int(limits.get("nvidia.com/gpu", "0"))
    if gpus:
        gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert gpu_toleration in pod["tolerations"], f"{name}: no GPU toleration"
        assert f"{label_prefix}/gpu-type" in pod["nodeSelector"], f"{name}: no GPU type nodeSelector"

    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    shm_mounts = [mount for mount in train["volumeMounts"] if mount["mountPath"] == "/dev/shm"]
    assert shm_mounts, f"{name}: /dev/shm is not mounted"
    shm = volumes[shm_mounts[0]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory", f"{name}: /dev/shm is not memory-backed"
    assert quantity_bytes(shm["sizeLimit"]) > 0, f"{name}: /dev/shm has no sizeLimit"
    memory_limit = quantity_bytes(limits["memory"])
    backed = memory_backed_bytes(pod)
    assert memory_limit >= backed, f"{name}: memory limit {memory_limit} < memory-backed volumes {backed}"

    staging = [c for c in pod.get("initContainers", []) if c["name"] == "stage"]
    if staging:
        assert "ephemeral-storage" in limits, f"{name}: staging without an ephemeral-storage limit"
        assert "ephemeral-storage" in requests, f"{name}: staging without an ephemeral-storage request"
        scratch = [volume for volume in pod["volumes"] if "emptyDir" in volume
                   and volume["emptyDir"].get("medium") != "Memory"]
        assert scratch and all("sizeLimit" in volume["emptyDir"] for volume in scratch), name
        staged = sum(quantity_bytes(volume["emptyDir"]["sizeLimit"]) for volume in scratch)
        assert quantity_bytes(limits["ephemeral-storage"]) >= staged, f"{name}: ephemeral < staged size"
        selector = pod["nodeSelector"]
        assert selector.get(f"{label_prefix}/disktype") == "nvme", f"{name}: staging without NVMe selector"

    if spec.get("completionMode") == "Indexed":
        assert spec["completions"] == spec["parallelism"] >= 2, name
        assert pod["subdomain"] == name, f"{name}: pods are not in the headless Service's subdomain"
        env = {item["name"]: item.get("value") for item in train["env"]}
        assert env["PET_RDZV_ENDPOINT"].startswith(f"{name}-0.{name}."), name
        # Pod hostnames are <job>-<index>: they must be DNS labels too.
        assert len(f"{name}-{spec['completions'] - 1}") <= 63, name
    check_metrics_ports(job, label_prefix)
    validate_strict(job, kubernetes_version)


def check_metrics_ports(job: dict[str, Any], label_prefix: str = "ml-cluster.io") -> None:
    """Every trainer process (one per GPU) and the S3 stager serve metrics on a named port the pod declares;
    the pod carries the label and annotations Prometheus discovers it by."""
    name = job["metadata"]["name"]
    template = job["spec"]["template"]
    pod = template["spec"]
    assert template["metadata"]["labels"][f"{label_prefix}/metrics"] == "true", name
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true", name
    train = pod["containers"][0]
    env = {item["name"]: item.get("value") for item in train["env"]}
    gpus = int(train["resources"]["limits"].get("nvidia.com/gpu", "0"))
    declared = {port["name"]: port["containerPort"] for port in train.get("ports", [])}
    base = int(env["METRICS_PORT"])
    assert annotations["prometheus.io/port"] == str(base), name
    assert env["METRICS_ADDR"] == "0.0.0.0", f"{name}: the trainer's endpoint would be unreachable from Prometheus"
    assert {f"metrics-r{rank}": base + rank for rank in range(max(gpus, 1))}.items() <= declared.items(), name
    for stager in pod.get("initContainers", []):
        command = stager["command"]
        if "workloads.data" not in command:
            continue  # a plain copy from a claim: no endpoint
        port = int(command[command.index("--metrics-port") + 1])
        assert [p for p in stager["ports"] if p["name"] == "metrics-stage"][0]["containerPort"] == port, name
        assert {"name": "METRICS_ADDR", "value": "0.0.0.0"} in stager["env"], name


def check_service(service: dict[str, Any], job: dict[str, Any], kubernetes_version: str = "1.33") -> None:
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["name"] == job["spec"]["template"]["spec"]["subdomain"]
    template_labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels.get(key) == value for key, value in service["spec"]["selector"].items())
    validate_strict(service, kubernetes_version)


def check_network_policy(policy: dict[str, Any], job: dict[str, Any], kubernetes_version: str = "1.33") -> None:
    """A gang's policy selects exactly the Job's pods and admits traffic from them alone."""
    gang = {"matchLabels": {"app.kubernetes.io/instance": job["metadata"]["name"]}}
    assert policy["spec"]["podSelector"] == gang
    assert [source for rule in policy["spec"]["ingress"] for source in rule["from"]] == [{"podSelector": gang}]
    template_labels = job["spec"]["template"]["metadata"]["labels"]
    assert template_labels["app.kubernetes.io/instance"] == job["metadata"]["name"]
    validate_strict(policy, kubernetes_version)


def check_companion(manifest: dict[str, Any], job: dict[str, Any], kubernetes_version: str = "1.33") -> None:
    checks = {"Service": check_service, "NetworkPolicy": check_network_policy}
    checks[manifest["kind"]](manifest, job, kubernetes_version)
