"""The GPU burn-in: a health-check DaemonSet per GPU pool that checks every new node before any training Job may
land on it, and labels it `<prefix>/gpu-health=passed` (or taints and cordons it with the reason).

Why a DaemonSet, one per pool: it reaches every node a pool brings up, the moment the node joins, with no
controller of ours watching for nodes; the pool fixes what "healthy" means (its GPUs per node, its EFA interfaces).
A DaemonSet pod never finishes, so it must not hold what training needs: it claims no `nvidia.com/gpu` or
`vpc.amazonaws.com/efa` (a claim would be held for the pod's life) and its requests are small (an init container's
requests count for the whole pod's life). The check containers reach the GPUs as dcgm-exporter does
(NVIDIA_VISIBLE_DEVICES=all through the NVIDIA container runtime) and run privileged, as NVIDIA's own validators do,
so the runtime exposes every GPU and the EFA device nodes whatever its envvar policy (Bottlerocket refuses the
variable to unprivileged containers). That is safe only because the checks run on a node nothing else uses yet: the
first step (`plan`) skips everything on a node that already passed, so a restarted pod never touches GPUs a Job
holds. Re-running the burn-in is the runbook's drain, unlabel, delete-the-pod.

The pod, in order (each init container always exits 0 and leaves its result and exit code in a shared emptyDir;
the last container decides, workloads/health/verdict.py):
1. `plan` (training image): reads its Node; writes `skip` when it already passed;
2. `dcgm` (NVIDIA's DCGM image): nv-hostengine in the pod, `dcgmi diag -r <level> -j`;
3. `gpu` (training image): torchrun, one process per GPU: memory pattern, matmul against the CPU and across
   GPUs, an NCCL all-reduce across the node (workloads/health/gpucheck.py);
4. `efa` (EFA pools; training image): EFA interfaces in sysfs and `fi_info -p efa`;
5. `report` (training image): the verdict, recorded on the Node (JSON patch guarded by resourceVersion); stays.

Least privilege: its own ServiceAccount whose ClusterRole may only `get` and `patch` nodes; the token is projected
into the two containers that talk to the API (`plan`, `report`), never into the privileged ones.

Manifests are built by pure functions; the GpuBurnIn component only registers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.nodepools import BURN_IN_NAME, GpuHealthConfig
from infra.context import ClusterInfo, StackContext
from infra.nodes.poolplan import PoolPlan
from workloads.jobspec.defaults import (
    HOME_ENV,
    SECCOMP_RUNTIME_DEFAULT,
    TMP_MOUNT,
    app_labels,
    health_gate_label,
    pull_policy,
    restricted_container,
    tolerate,
)
from workloads.jobspec.fields import RUN_AS_UID

SERVICE_ACCOUNT = APP = BURN_IN_NAME
RESULTS = "/results"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600

Manifest = dict[str, Any]


def _labels(stack: str, label_prefix: str, instance: str | None = None) -> dict[str, str]:
    labels = app_labels(APP, "gpu-health", stack, label_prefix, managed_by="pulumi")
    if instance is not None:
        labels["app.kubernetes.io/instance"] = instance
    return labels


# The label the gate requires and the burn-in sets: (`<prefix>/gpu-health`, `passed`), the training pods' own.
gpu_health_selector = health_gate_label


def _dcgm_script(level: int, deadline_s: int) -> str:
    """nv-hostengine in the pod (the node monitoring agent's and dcgm-exporter's engines live in other pods or on
    the host; this one listens on the pod's own loopback), then the diagnostic with a deadline."""
    return "\n".join([
        "set -u",
        f"[ -e {RESULTS}/skip ] && exit 0",
        "nv-hostengine -n -b 127.0.0.1 --pid /tmp/nv-hostengine.pid --log-level ERROR -f /tmp/nv-hostengine.log &",
        "engine=$!",
        "ready=0",
        "for i in $(seq 1 60); do dcgmi discovery -l >/dev/null 2>&1 && ready=1 && break; sleep 1; done",
        f"if [ $ready = 1 ]; then timeout {deadline_s} dcgmi diag -r {level} -j > {RESULTS}/dcgm.json "
        f"2> {RESULTS}/dcgm.err; echo $? > {RESULTS}/dcgm.rc",
        f"else echo 'nv-hostengine did not answer within 60s' > {RESULTS}/dcgm.err; echo 125 > {RESULTS}/dcgm.rc; fi",
        "kill $engine 2>/dev/null",
        f"cat {RESULTS}/dcgm.err",
        "exit 0",
    ])


def _gpu_script(gpus: int, fraction: float, deadline_s: int) -> str:
    return "\n".join([
        f"[ -e {RESULTS}/skip ] && exit 0",
        f"timeout {deadline_s} torchrun --standalone --nproc-per-node={gpus} -m workloads.health.gpucheck "
        f"--out {RESULTS} --memory-fraction {fraction:g} --timeout {max(deadline_s // 2, 60)} "
        f"> {RESULTS}/gpu.log 2>&1",
        f"echo $? > {RESULTS}/gpu.rc",
        f"tail -n 40 {RESULTS}/gpu.log",
        "exit 0",
    ])


def _efa_script(deadline_s: int) -> str:
    return (f"timeout {deadline_s} python -m workloads.health efa --results {RESULTS}; "
            f"echo $? > {RESULTS}/efa.rc; exit 0")


_RESTRICTED = {**restricted_container(), "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_UID}
# The checks: the NVIDIA runtime exposes every GPU and /dev/infiniband to a privileged container (see the module doc).
_PRIVILEGED = {"privileged": True, "readOnlyRootFilesystem": True}
_NODE_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
_GPU_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]


def _resources(cpu: str, memory: str, cpu_limit: str, memory_limit: str) -> dict[str, Any]:
    # Requests stay small: a DaemonSet pod's requests (its largest init container's too) are held for its life,
    # out of the systemReserved headroom the per-GPU sizes leave for node DaemonSets. Limits let a check use the
    # idle node it runs on (nothing else is scheduled there before the verdict).
    return {"requests": {"cpu": cpu, "memory": memory, "ephemeral-storage": "64Mi"},
            "limits": {"cpu": cpu_limit, "memory": memory_limit, "ephemeral-storage": "1Gi"}}


def burnin_daemonset(plan: PoolPlan, cfg: GpuHealthConfig, image: str, namespace: str, stack: str,
                     label_prefix: str) -> Manifest:
    deadline = cfg.check_minutes * 60
    health_key, _passed = gpu_health_selector(label_prefix)
    api_mount = {"name": "api-token", "mountPath": TOKEN_DIR, "readOnly": True}
    results_mount = {"name": "results", "mountPath": RESULTS}
    tmp_mount = TMP_MOUNT
    pull = pull_policy(image)
    node_args = ["--node", "$(NODE_NAME)", "--label-prefix", label_prefix, "--results", RESULTS]
    init: list[dict[str, Any]] = [
        {"name": "plan", "image": image, "imagePullPolicy": pull,
         "command": ["python", "-m", "workloads.health", "plan", *node_args],
         "env": [_NODE_ENV], "securityContext": _RESTRICTED, "resources": _resources("50m", "128Mi", "500m", "512Mi"),
         "volumeMounts": [results_mount, api_mount, tmp_mount]},
        {"name": "dcgm", "image": cfg.dcgm_image, "imagePullPolicy": "Always",
         "command": ["sh", "-c", _dcgm_script(cfg.diag_level, deadline)],
         # DCGM writes its diagnostic logs under its own directories: a writable root, as NVIDIA runs it.
         "env": _GPU_ENV, "securityContext": {"privileged": True},
         "resources": _resources("100m", "256Mi", "4", "8Gi"),
         "volumeMounts": [results_mount, tmp_mount]},
        {"name": "gpu", "image": image, "imagePullPolicy": pull,
         "command": ["sh", "-c", _gpu_script(plan.gpus_per_node, cfg.memory_fraction, deadline)],
         "env": [*_GPU_ENV, HOME_ENV],
         "securityContext": {**_PRIVILEGED, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_UID},
         "resources": _resources("100m", "512Mi", str(plan.gpus_per_node + 1), f"{4 * plan.gpus_per_node + 4}Gi"),
         # NCCL's shared-memory segments: a container's default 64 MiB /dev/shm fails an all-reduce across 8 GPUs
         "volumeMounts": [results_mount, tmp_mount, {"name": "shm", "mountPath": "/dev/shm"}]},
    ]
    expected = ["--expect-gpus", str(plan.gpus_per_node)]
    if plan.efa_interfaces:
        init.append({"name": "efa", "image": image, "imagePullPolicy": pull, "command": ["sh", "-c", _efa_script(120)],
                     "env": [HOME_ENV], "securityContext": _PRIVILEGED,
                     "resources": _resources("50m", "128Mi", "500m", "512Mi"),
                     "volumeMounts": [results_mount, tmp_mount]})
        expected += ["--expect-efa", str(plan.efa_interfaces)]
    report = {"name": "report", "image": image, "imagePullPolicy": pull,
              "command": ["python", "-m", "workloads.health", "report", *node_args, *expected],
              "env": [_NODE_ENV], "securityContext": _RESTRICTED,
              "resources": _resources("10m", "64Mi", "200m", "256Mi"),
              "volumeMounts": [results_mount, api_mount, tmp_mount]}
    # The pool's taints (the GPU taint among them), and the one the burn-in itself puts on a failed node: its pod
    # stays, so the next re-run (delete the pod) lands there again.
    tolerations = [tolerate(taint.key, taint.kubernetes_effect) for taint in plan.taints]
    tolerations.append(tolerate(health_key))
    selector = {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": plan.name}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": f"{APP}-{plan.name}", "namespace": namespace,
                     "labels": _labels(stack, label_prefix, plan.name),
                     # `up` does not wait for a burn-in (minutes per node) to finish on every node.
                     "annotations": {"pulumi.com/skipAwait": "true"}},
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}},
            "template": {
                "metadata": {"labels": {**_labels(stack, label_prefix, plan.name), **selector}},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "automountServiceAccountToken": False,
                    # The privileged check containers run unconfined whatever this says; plan and report do not.
                    "securityContext": {"seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT)},
                    "priorityClassName": "system-node-critical",
                    "nodeSelector": {f"{label_prefix}/pool": plan.name},
                    "tolerations": tolerations,
                    "terminationGracePeriodSeconds": 10,
                    "initContainers": init,
                    "containers": [report],
                    "volumes": [
                        {"name": "results", "emptyDir": {"sizeLimit": "64Mi"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                        {"name": "api-token", "projected": {"sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        ]}},
                    ],
                },
            },
        },
    }


def burnin_manifests(cfg: GpuHealthConfig, plans: Sequence[PoolPlan], image: str, stack: str,
                     label_prefix: str) -> list[Manifest]:
    """Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, then one DaemonSet per GPU pool."""
    namespace = cfg.namespace
    labels = _labels(stack, label_prefix)
    manifests: list[Manifest] = [
        # The check containers are privileged: the namespace admits them, and nothing else runs in it.
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {**labels, "pod-security.kubernetes.io/enforce": "privileged",
                                                    "pod-security.kubernetes.io/warn": "privileged"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace, "labels": labels},
         "automountServiceAccountToken": False},
        # Nodes are cluster-scoped and a DaemonSet pod's node is known only at run time: no resourceNames. get and
        # patch only: no list/watch (it reads its own node by name), no delete, no nodes/status.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"{stack}-{APP}", "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{stack}-{APP}", "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{stack}-{APP}"},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]},
    ]
    manifests += [burnin_daemonset(plan, cfg, image, namespace, stack, label_prefix) for plan in plans
                  if plan.is_gpu]
    return manifests


@dataclass(frozen=True)
class GpuBurnInArgs:
    ctx: StackContext
    cluster: ClusterInfo
    manifests: tuple[Manifest, ...]
    depends_on: tuple[pulumi.Resource, ...] = ()  # node groups: the DaemonSets' pods start as nodes join


class GpuBurnIn(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuBurnInArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:GpuBurnIn", name, None, opts)
        ctx, cluster = args.ctx, args.cluster
        in_cluster = pulumi.ResourceOptions(parent=self, provider=cluster.provider,
                                            depends_on=[*cluster.eks_dependencies, *args.depends_on])
        namespace_manifest, account_manifest, role_manifest, binding_manifest, *daemonsets = args.manifests
        namespace = k8s.core.v1.Namespace(ctx.name("gpu-health", "namespace"),
                                          metadata=namespace_manifest["metadata"], opts=in_cluster)
        after_ns = in_cluster.merge(pulumi.ResourceOptions(depends_on=[namespace]))
        account = k8s.core.v1.ServiceAccount(
            ctx.name("gpu-health", "service-account"), metadata=account_manifest["metadata"],
            automount_service_account_token=account_manifest["automountServiceAccountToken"], opts=after_ns)
        role = k8s.rbac.v1.ClusterRole(ctx.name("gpu-health", "cluster-role"), metadata=role_manifest["metadata"],
                                       rules=role_manifest["rules"], opts=in_cluster)
        binding = k8s.rbac.v1.ClusterRoleBinding(
            ctx.name("gpu-health", "cluster-role-binding"), metadata=binding_manifest["metadata"],
            role_ref=binding_manifest["roleRef"], subjects=binding_manifest["subjects"],
            opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=[role, account])))
        self.daemonsets = [
            k8s.apps.v1.DaemonSet(
                ctx.name("gpu-health", manifest["metadata"]["name"]), metadata=manifest["metadata"],
                spec=manifest["spec"],
                # A DaemonSet is ready only when a pod runs on every node; a pool at size 0 has none to wait for.
                opts=after_ns.merge(pulumi.ResourceOptions(depends_on=[account, binding])))
            for manifest in daemonsets
        ]
        self.register_outputs({"namespace": namespace_manifest["metadata"]["name"],
                               "daemonSets": [manifest["metadata"]["name"] for manifest in daemonsets]})
