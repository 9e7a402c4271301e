"""What a plan document holds that costs money: its node pools (type, capacity, sizes, disks, zones), its Jobs'
GPU use, EFS claims, S3 buckets, tenant teams' quotas, and so the unit prices it needs (`price_queries`). Pure
readers over scripts/plan.py --json; infra/plan/cost.py prices what they return."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from infra.plan.engine import offline_id
from infra.plan.pricing import (
    PriceQuery,
    block_hours,
    block_query,
    efs_query,
    eks_extended_query,
    eks_query,
    fsx_lustre_query,
    gp3_query,
    instance_query,
    nat_query,
    s3_query,
    spot_query,
)

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
BUCKET = "aws:s3/bucket:Bucket"
JOB = "kubernetes:batch/v1:Job"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
EFS_PROVISIONER = "efs.csi.aws.com"
PV = "kubernetes:core/v1:PersistentVolume"
NAMESPACE = "kubernetes:core/v1:Namespace"
KUEUE_TYPE_PREFIX = "kubernetes:kueue.x-k8s.io/"
TEAM_LABEL_SUFFIX = "/team"
GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL_SUFFIX = "/pool"
GPU_COUNT_LABEL_SUFFIX = "/gpu-count"


class PlanValueError(ValueError):
    """A plan resource whose input, read here, is not of the type a plan holds there (a plan edited by hand, or not
    one scripts/plan.py --json wrote): one line naming the resource, not a traceback."""


@contextmanager
def reading(resource: Mapping[str, Any]) -> Iterator[None]:
    """Around the reading of one resource's inputs: a wrong type or value becomes a PlanValueError naming it."""
    try:
        yield
    except PlanValueError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise PlanValueError(f"{resource.get('type')} {resource.get('name')}: an input of the wrong type or value "
                             f"({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Pool:
    name: str
    instance_type: str
    capacity_type: str  # ON_DEMAND or SPOT
    sizes: tuple[int, int, int]  # min, desired, max
    zones: tuple[str, ...]
    gpus_per_node: int
    labels: Mapping[str, str]
    disk_gib: float = 0.0  # gp3 GiB per node (root, and Bottlerocket's data volume)
    reserved: int = 0  # instances of a capacity reservation the pool launches into (stack output nodePools)
    reservation_id: str = ""
    reservation_hours: int = 24  # a Capacity Block's duration (block_hours of its startTime and endTime)


@dataclass(frozen=True)
class JobUse:
    name: str
    pods: int
    gpus_per_pod: int
    deadline_s: int | None
    node_selector: Mapping[str, str]


def _quantity_gib(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTPE]i?)?", str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a storage quantity")
    number, unit = float(match.group(1)), match.group(2) or ""
    binary = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    decimal = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    return number * (binary.get(unit) or decimal.get(unit) or 1) / 2**30


def resources_of(plan: Mapping[str, Any], token: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"] == token]


def plan_region(plan: Mapping[str, Any]) -> str | None:
    region = (plan.get("outputs") or {}).get("region")
    return str(region) if region else None


def pools_of(plan: Mapping[str, Any]) -> list[Pool]:
    subnet_azs = (plan.get("outputs") or {}).get("subnetAzs") or {}
    reservations = {name: facts.get("reservation") or {} for name, facts in
                    ((plan.get("outputs") or {}).get("nodePools") or {}).items() if isinstance(facts, Mapping)}
    # A node group names its launch template by id; offline, that id is derived from the template's name.
    disks: dict[str, float] = {}
    for template in resources_of(plan, LAUNCH_TEMPLATE):
        with reading(template):
            disks[offline_id(LAUNCH_TEMPLATE, template["name"])] = float(sum(
                float((m.get("ebs") or {}).get("volumeSize") or 0) for m in
                template["inputs"].get("blockDeviceMappings") or [] if (m.get("ebs") or {}).get("volumeType") == "gp3"))
    pools = []
    for resource in resources_of(plan, NODE_GROUP):
        with reading(resource):
            pools.extend(_pools_of_group(resource, subnet_azs, reservations, disks))
    return sorted(pools, key=lambda pool: pool.name)


def _pools_of_group(resource: Mapping[str, Any], subnet_azs: Mapping[str, Any],
                    reservations: Mapping[str, Any], disks: Mapping[str, float]) -> list[Pool]:
    pools = []
    inputs = resource["inputs"]
    labels = inputs.get("labels") or {}
    scaling = inputs.get("scalingConfig") or {}
    low, high = int(scaling.get("minSize") or 0), int(scaling.get("maxSize") or 0)
    desired = scaling.get("desiredSize")
    name = next((v for k, v in labels.items() if k.endswith(POOL_LABEL_SUFFIX)), resource["name"])
    gpus = next((int(v) for k, v in labels.items() if k.endswith(GPU_COUNT_LABEL_SUFFIX)), 0)
    for instance_type in (inputs.get("instanceTypes") or [])[:1]:  # the first type is what EKS launches first
        pools.append(Pool(name=str(name), instance_type=str(instance_type),
                          capacity_type=str(inputs.get("capacityType") or "ON_DEMAND"),
                          sizes=(low, int(desired) if desired is not None else low, high),
                          zones=tuple(sorted({str(subnet_azs[s]) for s in inputs.get("subnetIds") or []
                                              if s in subnet_azs})),
                          gpus_per_node=gpus, labels=labels,
                          disk_gib=disks.get(str((inputs.get("launchTemplate") or {}).get("id")),
                                             float(inputs.get("diskSize") or 0)),
                          reserved=int((reservations.get(str(name)) or {}).get("instanceCount") or 0),
                          reservation_id=str((reservations.get(str(name)) or {}).get("id") or ""),
                          reservation_hours=block_hours((reservations.get(str(name)) or {}).get("startTime"),
                                                        (reservations.get(str(name)) or {}).get("endTime"))))
    return pools


def jobs_of(plan: Mapping[str, Any]) -> list[JobUse]:
    jobs = []
    for resource in resources_of(plan, JOB):
        with reading(resource):
            spec = resource["inputs"].get("spec") or {}
            pod = (spec.get("template") or {}).get("spec") or {}
            gpus = sum(int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                       for c in pod.get("containers") or [])
            metadata = resource["inputs"].get("metadata") or {}
            name = ((metadata.get("labels") or {}).get("app.kubernetes.io/name") or metadata.get("name")
                    or resource["name"])
            deadline = spec.get("activeDeadlineSeconds")
            jobs.append(JobUse(name=str(name), pods=int(spec.get("parallelism") or 1), gpus_per_pod=gpus,
                               deadline_s=int(deadline) if deadline is not None else None,
                               node_selector=pod.get("nodeSelector") or {}))
    return sorted(jobs, key=lambda job: job.name)


def efs_claims(plan: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(namespace, GiB) of each PersistentVolumeClaim on EFS: of an EFS storage class of this plan, or bound to a
    static PV of the EFS CSI driver (a team's access point)."""
    classes = {(r["inputs"].get("metadata") or {}).get("name") for r in resources_of(plan, STORAGE_CLASS)
               if r["inputs"].get("provisioner") == EFS_PROVISIONER}
    efs_volumes = {(r["inputs"].get("metadata") or {}).get("name") for r in resources_of(plan, PV)
                   if ((r["inputs"].get("spec") or {}).get("csi") or {}).get("driver") == EFS_PROVISIONER}
    claims = []
    for claim in resources_of(plan, PVC):
        with reading(claim):
            spec = claim["inputs"].get("spec") or {}
            if spec.get("storageClassName") in classes or (spec.get("volumeName")
                                                            and spec["volumeName"] in efs_volumes):
                storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")
                claims.append((str((claim["inputs"].get("metadata") or {}).get("namespace") or ""),
                               _quantity_gib(storage)))
    return claims


def fsx_lustre_systems(plan: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(name, storage capacity GiB, MB/s/TiB) of each FSx for Lustre file system in the plan."""
    systems = []
    for resource in resources_of(plan, FSX_LUSTRE):
        with reading(resource):
            systems.append((resource["name"], int(resource["inputs"].get("storageCapacity") or 0),
                            int(resource["inputs"].get("perUnitStorageThroughput") or 0)))
    return systems


def efs_gib(plan: Mapping[str, Any]) -> float:
    """GiB requested by the PersistentVolumeClaims on EFS."""
    return sum(gib for _, gib in efs_claims(plan))


@dataclass(frozen=True)
class TeamQuota:
    """A tenant team's GPUs of one flavor: guaranteed (nominalQuota) and the most it may hold (None: no
    borrowingLimit, as much as the cohort lends)."""

    team: str
    namespace: str
    flavor: str
    gpus: int
    at_most: int | None


def _kueue(plan: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"].startswith(KUEUE_TYPE_PREFIX) and r["type"].endswith(f":{kind}")]


def team_namespaces_of(plan: Mapping[str, Any]) -> dict[str, str]:
    """Namespace -> team, for the namespaces labelled `<prefix>/team`."""
    found = {}
    for namespace in resources_of(plan, NAMESPACE):
        metadata = namespace["inputs"].get("metadata") or {}
        team = next((v for k, v in (metadata.get("labels") or {}).items() if k.endswith(TEAM_LABEL_SUFFIX)), None)
        if team and metadata.get("name"):
            found[str(metadata["name"])] = str(team)
    return found


def team_quotas_of(plan: Mapping[str, Any]) -> list[TeamQuota]:
    """The GPU quotas of the ClusterQueues that admit exactly one team namespace (flavors with a guarantee)."""
    teams = team_namespaces_of(plan)
    quotas = []
    for queue in _kueue(plan, "ClusterQueue"):
        with reading(queue):
            spec = queue["inputs"].get("spec") or {}
            selector = (spec.get("namespaceSelector") or {}).get("matchLabels") or {}
            namespace = selector.get("kubernetes.io/metadata.name")
            if namespace not in teams:
                continue
            for group in spec.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    for resource in flavor.get("resources") or []:
                        if resource.get("name") != GPU_RESOURCE or not int(resource.get("nominalQuota") or 0):
                            continue
                        gpus = int(resource["nominalQuota"])
                        borrow = resource.get("borrowingLimit")
                        quotas.append(TeamQuota(teams[namespace], str(namespace), str(flavor.get("name")), gpus,
                                                gpus + int(borrow) if borrow is not None else None))
    return sorted(quotas, key=lambda quota: (quota.team, quota.flavor))


def flavor_pools(plan: Mapping[str, Any], pools: Sequence[Pool]) -> dict[str, list[Pool]]:
    """ResourceFlavor name -> the GPU pools whose labels carry all its nodeLabels."""
    found = {}
    for flavor in _kueue(plan, "ResourceFlavor"):
        with reading(flavor):
            labels = (flavor["inputs"].get("spec") or {}).get("nodeLabels") or {}
            name = (flavor["inputs"].get("metadata") or {}).get("name")
            if labels and name:
                found[str(name)] = [pool for pool in pools if pool.gpus_per_node
                                    and all(pool.labels.get(k) == v for k, v in labels.items())]
    return found


def pool_query(region: str, pool: Pool) -> PriceQuery:
    """A pool's instances cost the type's Spot price for SPOT pools, a Capacity Block's offering price per
    instance-hour for blocks, its on-demand list price otherwise."""
    if pool.capacity_type == "SPOT":
        return spot_query(region, pool.instance_type, pool.zones)
    if pool.capacity_type == "CAPACITY_BLOCK":
        return block_query(region, pool.instance_type, pool.reserved, pool.reservation_hours, pool.zones)
    return instance_query(region, pool.instance_type)


def price_queries(plan: Mapping[str, Any]) -> list[PriceQuery]:
    """Every unit price the plan needs, each once, in a fixed order."""
    region = plan_region(plan)
    if region is None:
        return []
    queries: dict[str, PriceQuery] = {}
    for pool in pools_of(plan):
        query = pool_query(region, pool)
        if query.key in queries and query.kind == "spot":  # two Spot pools of one type: every zone of both
            query = spot_query(region, pool.instance_type, queries[query.key].zones + query.zones)
        queries[query.key] = query
    if any(pool.disk_gib for pool in pools_of(plan)):
        queries.setdefault(f"gp3:{region}", gp3_query(region))
    if resources_of(plan, NAT_GATEWAY):
        queries.setdefault(f"nat:{region}", nat_query(region))
    if resources_of(plan, EKS_CLUSTER):  # both tiers: which one applies depends on the day the estimate is made
        queries.setdefault(f"eks:{region}", eks_query(region))
        queries.setdefault(f"eks-extended:{region}", eks_extended_query(region))
    if resources_of(plan, EFS_FILE_SYSTEM):
        queries.setdefault(f"efs:{region}", efs_query(region))
    for _, _, throughput in fsx_lustre_systems(plan):
        query = fsx_lustre_query(region, throughput)
        queries.setdefault(query.key, query)
    if resources_of(plan, BUCKET):
        queries.setdefault(f"s3:{region}", s3_query(region))
    return list(queries.values())
