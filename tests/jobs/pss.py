"""The Pod Security Standards `restricted` profile, rule by rule, as a checker for rendered pod specs.

Written from the Kubernetes "Pod Security Standards" page (kubernetes.io/docs/concepts/security/
pod-security-standards/): every Baseline control, then every Restricted control, in the page's order. The
namespace the Jobs run in enforces `restricted`, so a pod that fails here would be refused by the API server.
"""

from __future__ import annotations

from typing import Any

# Baseline "Capabilities": the only ones a container may add.
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every Restricted-profile rule the pod spec breaks, one line each (empty: the pod is admitted)."""
    problems: list[str] = []
    pod_security = pod.get("securityContext") or {}
    containers = _containers(pod)

    # ---- Baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"Host Namespaces: {field} is true")
    if pod_security.get("windowsOptions", {}).get("hostProcess"):
        problems.append("HostProcess: pod windowsOptions.hostProcess")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            problems.append(f"HostPath Volumes: volume {volume['name']}")
    for sysctl in pod_security.get("sysctls", []):
        if sysctl["name"] not in _SAFE_SYSCTLS:
            problems.append(f"Sysctls: {sysctl['name']} is not in the safe set")
    for where, context in [("pod", pod_security)] + [(c["name"], c.get("securityContext") or {}) for c in containers]:
        se_linux = context.get("seLinuxOptions") or {}
        if se_linux.get("type") not in _SELINUX_TYPES or se_linux.get("user") or se_linux.get("role"):
            problems.append(f"SELinux: {where} sets seLinuxOptions {se_linux}")
        if (context.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            problems.append(f"AppArmor: {where} profile {context['appArmorProfile']}")
        if (context.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            problems.append(f"Seccomp: {where} profile {context['seccompProfile']}")  # also Restricted
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"Privileged Containers: {name}")
        if context.get("windowsOptions", {}).get("hostProcess"):
            problems.append(f"HostProcess: {name}")
        added = set((context.get("capabilities") or {}).get("add", []))
        if added - _BASELINE_CAPABILITIES:
            problems.append(f"Capabilities: {name} adds {sorted(added - _BASELINE_CAPABILITIES)}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"Host Ports: {name} port {port['hostPort']}")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"/proc Mount Type: {name} procMount {context['procMount']}")

    # ---- Restricted
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            problems.append(f"Volume Types: volume {volume['name']} is {sorted(kinds)}")
    pod_non_root = pod_security.get("runAsNonRoot") is True
    pod_seccomp = (pod_security.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_security.get("runAsUser") == 0:
        problems.append("Running as Non-root user: pod runAsUser 0")
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"Privilege Escalation: {name} allowPrivilegeEscalation is not false")
        if context.get("runAsNonRoot") is False or not (pod_non_root or context.get("runAsNonRoot") is True):
            problems.append(f"Running as Non-root: {name} runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            problems.append(f"Running as Non-root user: {name} runAsUser 0")
        container_seccomp = (context.get("seccompProfile") or {}).get("type")
        if container_seccomp is None and not pod_seccomp:
            problems.append(f"Seccomp: {name} has no RuntimeDefault/Localhost profile (nor the pod)")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"Capabilities: {name} does not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"Capabilities: {name} adds more than NET_BIND_SERVICE")
    return problems
