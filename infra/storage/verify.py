"""Post-deploy checks of a stack's storage: what `pulumi up` created, seen through the AWS and Kubernetes API.

Each check yields rows (name, PASS/FAIL/SKIP, detail). Inputs are the stack outputs (`storage` and friends, as
`pulumi stack output --json` prints them) and API clients, so tests can point the clients at moto or fakes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from infra.storage.efs import NFS_PORT
from workloads.submit.kube import DEFAULT_REQUEST_TIMEOUT_S
from workloads.submit.kueue import KUEUE_GROUP, kueue_versions

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


class OutputsError(ValueError):
    """The stack outputs lack what verification needs; `where` names the missing output."""

    def __init__(self, where: str, why: str):
        self.where = where
        super().__init__(f"{where}: {why}")


def storage_outputs(outputs: Mapping[str, Any]) -> Mapping[str, Any]:
    storage = outputs.get("storage")
    if not isinstance(storage, Mapping):
        raise OutputsError("storage", "missing from the stack outputs (an ml-cluster stack after `up`?)")
    return storage


def _aws_error(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip()
    return str(exc)


def check_mount_targets(
    ec2: Any, efs: Any, file_system_id: str, security_group_id: str, subnet_ids: Iterable[str]
) -> list[Check]:
    """Every AZ of the node subnets has an available mount target in the EFS security group."""
    subnets = ec2.describe_subnets(SubnetIds=list(subnet_ids))["Subnets"]
    zones = sorted({subnet["AvailabilityZone"] for subnet in subnets})
    targets = efs.describe_mount_targets(FileSystemId=file_system_id)["MountTargets"]
    by_zone: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        by_zone.setdefault(target["AvailabilityZoneName"], []).append(target)
    checks = []
    for zone in zones:
        name = f"efs mount target {zone}"
        candidates = [t for t in by_zone.get(zone, []) if t["LifeCycleState"] == "available"]
        if not candidates:
            checks.append(Check(name, "FAIL", f"no available mount target of {file_system_id} in {zone}"))
            continue
        target = candidates[0]
        groups = efs.describe_mount_target_security_groups(MountTargetId=target["MountTargetId"])[
            "SecurityGroups"
        ]
        if security_group_id in groups:
            checks.append(Check(name, "PASS", f"{target['MountTargetId']} in {target['SubnetId']}"))
        else:
            checks.append(
                Check(name, "FAIL", f"{target['MountTargetId']} has {groups}, not {security_group_id}")
            )
    return checks


def check_nfs_rule(ec2: Any, security_group_id: str, node_security_group_id: str) -> list[Check]:
    """The EFS group admits TCP 2049 from the node group, and from nothing wider."""
    group = ec2.describe_security_groups(GroupIds=[security_group_id])["SecurityGroups"][0]
    nfs_rules = [
        rule
        for rule in group.get("IpPermissions", [])
        if rule.get("IpProtocol") in ("tcp", "-1")
        and (rule.get("IpProtocol") == "-1" or rule.get("FromPort", 0) <= NFS_PORT <= rule.get("ToPort", -1))
    ]
    sources = {pair["GroupId"] for rule in nfs_rules for pair in rule.get("UserIdGroupPairs", [])}
    ranges = sorted(
        {r["CidrIp"] for rule in nfs_rules for r in rule.get("IpRanges", [])}
        | {r["CidrIpv6"] for rule in nfs_rules for r in rule.get("Ipv6Ranges", [])}
    )
    checks = [
        Check(
            "efs sg admits 2049 from nodes",
            "PASS" if node_security_group_id in sources else "FAIL",
            f"{security_group_id}: sources {sorted(sources) or 'none'}",
        )
    ]
    checks.append(
        Check(
            "efs sg admits nothing else",
            "FAIL" if ranges or sources - {node_security_group_id} else "PASS",
            f"also open to {sorted(sources - {node_security_group_id}) + ranges}"
            if ranges or sources - {node_security_group_id}
            else "node security group only",
        )
    )
    return checks


def _denies_plain_http(policy: Mapping[str, Any], bucket: str) -> bool:
    statements = policy.get("Statement", [])
    if isinstance(statements, Mapping):
        statements = [statements]
    for statement in statements:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = statement.get("Resource", [])
        resources = [resources] if isinstance(resources, str) else resources
        condition = statement.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")
        if (
            statement.get("Effect") == "Deny"
            and statement.get("Principal") in ("*", {"AWS": "*"})
            and {"s3:*", "*"} & set(actions)
            and str(condition).lower() == "false"
            and any(r.endswith(f":::{bucket}/*") for r in resources)
            and any(r.endswith(f":::{bucket}") for r in resources)
        ):
            return True
    return False


def check_bucket(s3: Any, bucket: str) -> list[Check]:
    """Default encryption, all four public-access-block settings, a policy denying requests without TLS."""
    checks = []
    try:
        rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
        algorithms = sorted({rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] for rule in rules})
        checks.append(
            Check(f"s3 {bucket} encryption", "PASS" if algorithms else "FAIL", ", ".join(algorithms))
        )
    except ClientError as exc:
        checks.append(Check(f"s3 {bucket} encryption", "FAIL", _aws_error(exc)))
    try:
        block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        off = sorted(
            key
            for key in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
            if not block.get(key)
        )
        checks.append(
            Check(
                f"s3 {bucket} public access block",
                "FAIL" if off else "PASS",
                f"off: {', '.join(off)}" if off else "all four on",
            )
        )
    except ClientError as exc:
        checks.append(Check(f"s3 {bucket} public access block", "FAIL", _aws_error(exc)))
    try:
        policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
        tls_only = _denies_plain_http(policy, bucket)
        checks.append(
            Check(
                f"s3 {bucket} tls-only policy",
                "PASS" if tls_only else "FAIL",
                "denies aws:SecureTransport=false" if tls_only else "no Deny for non-TLS requests",
            )
        )
    except ClientError as exc:
        checks.append(Check(f"s3 {bucket} tls-only policy", "FAIL", _aws_error(exc)))
    return checks


FSX_ADDON = "aws-fsx-csi-driver"


def check_fsx(fsx: Any, eks: Any, outputs: Mapping[str, Any], cluster_name: str) -> list[Check]:
    """The FSx for Lustre file system is AVAILABLE at the DNS name the PV mounts, each data repository association
    of the stack is AVAILABLE on it (a MISCONFIGURED one has lost its bucket or its permissions), and the FSx CSI
    add-on is ACTIVE (FSx API: DescribeFileSystems, DescribeDataRepositoryAssociations; EKS: DescribeAddon)."""
    file_system_id = outputs["fileSystemId"]
    found = fsx.describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"]
    checks = []
    if not found:
        return [Check(f"fsx {file_system_id}", "FAIL", "not found")]
    system = found[0]
    lifecycle, dns = system.get("Lifecycle"), system.get("DNSName")
    problems = [] if lifecycle == "AVAILABLE" else [f"lifecycle {lifecycle}"]
    if dns != outputs.get("dnsName"):
        problems.append(f"DNS name {dns}, the PV mounts {outputs.get('dnsName')}")
    checks.append(Check(f"fsx {file_system_id}", "FAIL" if problems else "PASS", "; ".join(problems) or (
        f"AVAILABLE, {system.get('StorageCapacity')} GiB "
        f"{(system.get('LustreConfiguration') or {}).get('DeploymentType')}")))
    associations = fsx.describe_data_repository_associations(
        Filters=[{"Name": "file-system-id", "Values": [file_system_id]}])["Associations"]
    by_path = {item.get("FileSystemPath"): item for item in associations}
    for path in outputs.get("associations") or ():
        item = by_path.get(path)
        if item is None:
            checks.append(Check(f"fsx dra {path}", "FAIL", f"no data repository association at {path}"))
            continue
        state = item.get("Lifecycle")
        detail = f"{state}: {item.get('DataRepositoryPath')}"
        if state != "AVAILABLE" and item.get("FailureDetails"):
            detail += f" ({item['FailureDetails'].get('Message')})"
        checks.append(Check(f"fsx dra {path}", "PASS" if state == "AVAILABLE" else "FAIL", detail))
    if cluster_name:
        addon = eks.describe_addon(clusterName=cluster_name, addonName=FSX_ADDON)["addon"]
        status = addon.get("status")
        checks.append(Check(f"addon {FSX_ADDON}", "PASS" if status == "ACTIVE" else "FAIL",
                            f"{status} at {addon.get('addonVersion')}"))
    return checks


def check_claims_bound(core_api: Any, claims: Iterable[tuple[str, str]]) -> list[Check]:
    """Each static claim (namespace, name) is Bound to its volume: the file system's PV/PVC (and its teams')."""
    checks = []
    for namespace, name in claims:
        phase = core_api.read_namespaced_persistent_volume_claim(name, namespace).status.phase
        checks.append(Check(f"pvc {namespace}/{name}", "PASS" if phase == "Bound" else "FAIL", str(phase)))
    return checks


def aws_checks(outputs: Mapping[str, Any], client: Callable[[str], Any]) -> list[Check]:
    """`client(service)` returns a boto3 client (region and endpoint decided by the caller)."""
    storage = storage_outputs(outputs)
    checks: list[Check] = []
    efs = storage.get("efs")
    if efs:
        try:
            checks += check_mount_targets(
                client("ec2"), client("efs"), efs["fileSystemId"], efs["securityGroupId"], efs["subnetIds"]
            )
            checks += check_nfs_rule(client("ec2"), efs["securityGroupId"], efs["nodeSecurityGroupId"])
        except (ClientError, BotoCoreError) as exc:
            checks.append(Check("efs", "FAIL", _aws_error(exc)))
    else:
        checks.append(Check("efs", "SKIP", "no file system in this stack"))
    fsx = storage.get("fsxLustre")
    if fsx:
        try:
            checks += check_fsx(client("fsx"), client("eks"), fsx, str(outputs.get("clusterName") or ""))
        except (ClientError, BotoCoreError) as exc:
            checks.append(Check("fsx", "FAIL", _aws_error(exc)))
    for bucket in sorted((storage.get("buckets") or {}).values()):
        try:
            checks += check_bucket(client("s3"), bucket)
        except BotoCoreError as exc:
            checks.append(Check(f"s3 {bucket}", "FAIL", _aws_error(exc)))
    return checks


def check_storage_classes(storage_api: Any, expected: Iterable[str]) -> list[Check]:
    present = {item.metadata.name for item in storage_api.list_storage_class().items}
    return [
        Check(
            f"storageclass {name}",
            "PASS" if name in present else "FAIL",
            "exists" if name in present else "missing",
        )
        for name in sorted(expected)
    ]


def check_nodes(core_api: Any, label_prefix: str) -> list[Check]:
    """GPU nodes carry the gpu-type label and allocatable GPUs; NVMe nodes carry their size label."""
    nodes = core_api.list_node().items
    gpu_nodes = [
        n
        for n in nodes
        if int((n.status.capacity or {}).get("nvidia.com/gpu", "0")) > 0
        or f"{label_prefix}/gpu-type" in (n.metadata.labels or {})
    ]
    nvme_nodes = [n for n in nodes if (n.metadata.labels or {}).get(f"{label_prefix}/disktype") == "nvme"]
    checks = []
    if not gpu_nodes:
        checks.append(Check("gpu nodes", "SKIP", "no GPU node is running (pools scale from zero)"))
    for node in gpu_nodes:
        labels, name = node.metadata.labels or {}, node.metadata.name
        gpus = int((node.status.allocatable or {}).get("nvidia.com/gpu", "0"))
        problems = [] if gpus > 0 else ["no allocatable nvidia.com/gpu"]
        if f"{label_prefix}/gpu-type" not in labels:
            problems.append(f"no {label_prefix}/gpu-type label")
        checks.append(
            Check(
                f"gpu node {name}",
                "FAIL" if problems else "PASS",
                "; ".join(problems) or f"{gpus} GPU(s), {labels[f'{label_prefix}/gpu-type']}",
            )
        )
    if not nvme_nodes:
        checks.append(Check("nvme nodes", "SKIP", f"no {label_prefix}/disktype=nvme node is running"))
    for node in nvme_nodes:
        labels, name = node.metadata.labels or {}, node.metadata.name
        size = labels.get(f"{label_prefix}/nvme-gib")
        checks.append(
            Check(
                f"nvme node {name}",
                "PASS" if size else "FAIL",
                f"{size} GiB instance store" if size else f"no {label_prefix}/nvme-gib label",
            )
        )
    return checks


def check_test_claim(
    core_api: Any,
    storage_api: Any,
    namespace: str,
    classes: Iterable[str],
    timeout_s: float = 120.0,
    poll_s: float = 2.0,
) -> list[Check]:
    """A small PVC on the first Immediate-binding class of the stack binds; it is deleted afterwards."""
    immediate = [
        item.metadata.name
        for item in storage_api.list_storage_class().items
        if item.metadata.name in set(classes) and (item.volume_binding_mode or "Immediate") == "Immediate"
    ]
    if not immediate:
        return [
            Check(
                "test pvc binds", "SKIP", "no Immediate-binding class (WaitForFirstConsumer waits for a pod)"
            )
        ]
    class_name = sorted(immediate)[0]
    claim_name = f"verify-stack-{int(time.time())}"
    body = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name, "labels": {"app.kubernetes.io/managed-by": "verify-stack"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": class_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    core_api.create_namespaced_persistent_volume_claim(namespace, body)
    try:
        deadline = time.monotonic() + timeout_s
        phase = None
        while True:
            phase = core_api.read_namespaced_persistent_volume_claim(claim_name, namespace).status.phase
            if phase == "Bound" or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
    finally:
        core_api.delete_namespaced_persistent_volume_claim(claim_name, namespace)
    return [
        Check(
            f"test pvc binds ({class_name})",
            "PASS" if phase == "Bound" else "FAIL",
            f"{namespace}/{claim_name}: {phase}",
        )
    ]


def kubernetes_checks(
    outputs: Mapping[str, Any], core_api: Any, storage_api: Any, label_prefix: str, timeout_s: float = 120.0
) -> list[Check]:
    storage = storage_outputs(outputs)
    classes = storage.get("storageClasses") or []
    checks = check_storage_classes(storage_api, classes)
    checks += check_nodes(core_api, label_prefix)
    checks += check_test_claim(
        core_api, storage_api, storage.get("namespace") or "training", classes, timeout_s
    )
    fsx = storage.get("fsxLustre") or {}
    checks += check_claims_bound(core_api, [(claim["namespace"], claim["name"]) for claim in fsx.get("claims") or ()])
    return checks


def list_kueue(custom: Any, plural: str, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every Kueue object of `plural` (clusterqueues, localqueues) through a kubernetes CustomObjectsApi (a
    workloads.submit.kube TimedApi: every call within `timeout_s`), in the version the API server's discovery says
    the cluster's Kueue serves, as `submit` reads it (workloads.submit.kueue.kueue_versions: v1beta2 from Kueue
    0.15.0, v1beta1 for an adopted older one); where discovery cannot be read, v1beta2 then v1beta1 on a 404; none
    where the server serves no Kueue. What check_queues reads (status conditions, spec.clusterQueue) has the same
    names in both versions."""
    versions = kueue_versions(custom.api_client, timeout_s)
    for version in versions:
        try:
            found = custom.list_cluster_custom_object(KUEUE_GROUP, version, plural)
            return list(found.get("items") or [])
        except Exception as exc:  # the kubernetes client's ApiException; only a 404 means "not served"
            if getattr(exc, "status", None) != 404 or version == versions[-1]:
                raise
    return []


def check_queues(outputs: Mapping[str, Any], cluster_queues: Iterable[Mapping[str, Any]],
                 local_queues: Iterable[Mapping[str, Any]]) -> list[Check]:
    """On a stack with Kueue: every LocalQueue of the jobFacts output exists in the Jobs' namespace and is Active
    (condition `Active`, apis/kueue/v1beta2/localqueue_types.go:156 at v0.19.2), and so is the ClusterQueue each
    points at (clusterqueue_types.go:29). An inactive queue admits nothing: its message says why (a missing flavor,
    a stopped queue)."""
    facts = outputs.get("jobFacts") or {}
    if not facts.get("kueue"):
        return [Check("kueue queues", "SKIP", "the stack runs no Kueue")]

    def active(item: Mapping[str, Any]) -> tuple[bool, str]:
        for condition in (item.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Active":
                return condition.get("status") == "True", str(condition.get("message") or condition.get("reason"))
        return False, "no Active condition yet"

    namespace = facts.get("namespace") or "training"
    by_name = {(item.get("metadata") or {}).get("name"): item for item in local_queues
               if (item.get("metadata") or {}).get("namespace") == namespace}
    cqs = {(item.get("metadata") or {}).get("name"): item for item in cluster_queues}
    checks = []
    for name in facts.get("local_queues") or ():
        queue = by_name.get(name)
        if queue is None:
            checks.append(Check(f"localqueue {namespace}/{name}", "FAIL", "missing"))
            continue
        ok, why = active(queue)
        target = (queue.get("spec") or {}).get("clusterQueue")
        cluster_queue = cqs.get(target)
        if ok and cluster_queue is None:
            ok, why = False, f"its ClusterQueue {target} is missing"
        elif ok and cluster_queue is not None:
            ok, why = active(cluster_queue)
            why = f"ClusterQueue {target}: {why}"
        checks.append(Check(f"localqueue {namespace}/{name}", "PASS" if ok else "FAIL", why))
    return checks


def render_table(checks: Iterable[Check]) -> str:
    rows = [("CHECK", "RESULT", "DETAIL"), *((c.name, c.status, c.detail) for c in checks)]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}" for row in rows)
