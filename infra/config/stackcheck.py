"""Cross-resource checks of a whole stack, run before any resource is registered.

Schema validation (infra.config.schema) sees one stack file; these checks also need the stack name, the account,
the private subnets' zones and the rendered Jobs, and look across sections: every derived physical name against
its service's rules and for uniqueness (infra.config.names), node pools pinned to zones the network has, and
what the Jobs read from and write to S3 against what the stack can grant them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config.addons import stack_addons, unused_external_addons
from infra.config.fsx import TEAM_FSX_ROOT, FsxDataRepositoryAssociationConfig
from infra.config.names import (
    CONFIG,
    JOBS_NAMESPACE,
    check_derived_names,
    check_stack_name,
    default_bucket_name,
    derived_names,
)
from infra.config.queueing import TEAM_EFS_ROOT
from infra.config.schema import ConfigError, StackConfig
from infra.config.storage import MIN_ADDON_VERSIONS, MIN_ADDON_WHY, NODE_MONITORING_AGENT, addon_semver
from workloads.jobspec.teamdata import TeamPrefixes, team_prefix_problems


@dataclass(frozen=True)
class JobBucketAccess:
    """What the stack's Jobs do with its S3 buckets, by logical bucket key: read (stage from, resume from) and
    write (checkpoint to). The Jobs' IAM policy grants exactly this."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def used(self) -> bool:
        return bool(self.read or self.write)


def _bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


def _cos_bucket_names(cfg: StackConfig, stack: str) -> dict[str, str]:
    cos = cfg.storage.cos
    return {b.name: b.bucket_name or default_bucket_name(stack, b.name, None) for b in (cos.buckets if cos else [])}


def _s3_bucket_names(cfg: StackConfig, stack: str, account_id: str | None) -> dict[str, str]:
    if cfg.platform != "eks":
        return {}
    return {b.name: b.bucket_name or default_bucket_name(stack, b.name, account_id) for b in cfg.storage.buckets}


def job_bucket_names(cfg: StackConfig, stack: str, account_id: str | None) -> dict[str, str]:
    """Logical bucket name -> physical bucket name of every bucket the Jobs can address, S3 (EKS) and COS alike:
    what a spec's `bucket: <name>` resolves to (ClusterFacts.buckets). Logical names are unique across both."""
    return {**_s3_bucket_names(cfg, stack, account_id), **_cos_bucket_names(cfg, stack)}


def job_object_store_buckets(cfg: StackConfig, stack: str) -> tuple[str, ...] | None:
    """The physical buckets Jobs reach through the COS endpoint (ClusterFacts.object_store_buckets): on EKS the
    COS buckets (every other bucket is AWS S3); None (every bucket) where COS is the only object store."""
    if cfg.storage.cos is None or cfg.platform != "eks":
        return None
    return tuple(sorted(_cos_bucket_names(cfg, stack).values()))


def store_name_problems(cfg: StackConfig, stack: str, account_id: str | None) -> list[tuple[str, str]]:
    """An S3 and a COS bucket of one name: a Job's s3://<name>/ URI could not say which store it means."""
    s3_physical = {name: key for key, name in _s3_bucket_names(cfg, stack, account_id).items()}
    cos_physical = _cos_bucket_names(cfg, stack)
    problems = []
    for index, bucket in enumerate(cfg.storage.cos.buckets if cfg.storage.cos else []):
        name = cos_physical[bucket.name]
        if name in s3_physical:
            where = "bucketName" if bucket.bucket_name else "name"
            problems.append((f"{CONFIG}storage.cos.buckets[{index}].{where}",
                             f"{name} is also the name of S3 bucket {s3_physical[name]}: a Job's s3://{name}/ URI "
                             f"would not say which store it means; give COS bucket {bucket.name} another "
                             "bucketName"))
    return problems


def job_bucket_access(cfg: StackConfig, stack: str, account_id: str | None) -> JobBucketAccess:
    """Derive the Jobs' bucket access from their specs; a bucket the stack cannot grant is a problem (EKS only:
    on onprem the COS HMAC keys, not a role, decide what a Job can reach)."""
    if cfg.platform != "eks":
        return JobBucketAccess()
    by_physical = {name: key for key, name in _s3_bucket_names(cfg, stack, account_id).items()}
    in_cos = set(_cos_bucket_names(cfg, stack).values())  # the COS HMAC keys, not the role, reach these
    known = ", ".join(sorted(by_physical)) or "none"
    read: set[str] = set()
    write: set[str] = set()
    problems: list[tuple[str, str]] = []
    for index, spec in enumerate(cfg.jobs):
        if spec.team is not None:
            continue  # a team's Job runs with the team's role (team_problems checks its prefixes)
        # A logical bucket is one of the stack's by construction (an unknown one fails rendering, naming the field).
        for target, into in ((spec.dataset, read), (spec.checkpoint, write)):
            if target is not None and target.bucket is not None and target.bucket in by_physical.values():
                into.add(target.bucket)
        uses = []
        if spec.dataset is not None and spec.dataset.uri is not None:
            uses.append(("dataset.uri", spec.dataset.uri, "read", read))
        for m_index, source in enumerate((spec.dataset.mixture or []) if spec.dataset is not None else []):
            if source.bucket is not None and source.bucket in by_physical.values():
                read.add(source.bucket)
            elif source.uri is not None:
                uses.append((f"dataset.mixture[{m_index}].uri", source.uri, "read", read))
        if spec.checkpoint is not None and spec.checkpoint.uri is not None:
            uses.append(("checkpoint.uri", spec.checkpoint.uri, "write", write))
        for where, uri, verb, into in uses:
            bucket = _bucket_of(uri)
            if bucket in in_cos:
                continue
            if bucket not in by_physical:
                problems.append((f"{CONFIG}jobs[{index}].{where}",
                                 f"bucket {bucket!r} is not one of this stack's S3 buckets ({known}): the Jobs' "
                                 f"role cannot {verb} it; add it to ml-cluster:storage.buckets"))
                continue
            into.add(by_physical[bucket])
    return JobBucketAccess(read=tuple(sorted(read | write)), write=tuple(sorted(write)), problems=problems)


def team_problems(cfg: StackConfig, training_namespace: str,
                  buckets: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Tenant teams: Kueue on, a namespace of their own, prefixes in the stack's own S3 buckets; a Job that names a
    team uses only that team's prefixes (a Job of no team may use no team's prefix, by bucket or by a uri in
    `buckets`: logical -> physical name, job_bucket_names)."""
    problems: list[tuple[str, str]] = []
    teams = {team.name: team for team in cfg.kueue.teams}
    where = f"{CONFIG}kueue.teams"
    stack_buckets = {bucket.name for bucket in cfg.storage.buckets} if cfg.platform == "eks" else set()
    for index, team in enumerate(cfg.kueue.teams):
        if team.namespace is None:
            continue
        if not cfg.kueue.enabled:
            problems.append((f"{where}[{index}].namespace", f"team {team.name}: a team namespace needs Kueue "
                                                            f"({CONFIG}kueue.enabled): its quota is the queue's"))
        if team.namespace in (training_namespace, cfg.kueue.namespace, cfg.monitoring.namespace):
            problems.append((f"{where}[{index}].namespace", f"team {team.name}: namespace {team.namespace} is the "
                                                            "stack's own; a team gets a namespace of its own"))
        for kind, entries in (("datasets", team.datasets), ("checkpoints", team.checkpoints)):
            for d_index, data in enumerate(entries):
                if cfg.platform != "eks":
                    problems.append((f"{where}[{index}].{kind}[{d_index}].bucket",
                                     f"team {team.name}: per-team bucket roles are EKS Pod Identity roles; on "
                                     f"{cfg.platform} the object store's keys decide access"))
                elif data.bucket not in stack_buckets:
                    problems.append((f"{where}[{index}].{kind}[{d_index}].bucket",
                                     f"team {team.name}: bucket {data.bucket} is not one of this stack's S3 buckets "
                                     f"({', '.join(sorted(stack_buckets)) or 'none'})"))
        cluster_principals = {entry.principal_arn for entry in cfg.cluster.access_entries} if cfg.cluster else set()
        for m_index, member in enumerate(team.members):
            if member.principal_arn is None:
                continue
            if cfg.platform != "eks":
                problems.append((f"{where}[{index}].members[{m_index}].principalArn",
                                 f"team {team.name}: IAM principals get in through EKS access entries; on "
                                 f"{cfg.platform} name the group the cluster's authenticator reports (group:)"))
            elif member.principal_arn in cluster_principals:
                # EKS holds one access entry per principal (a second CreateAccessEntry: ResourceInUseException).
                problems.append((f"{where}[{index}].members[{m_index}].principalArn",
                                 f"team {team.name}: {member.principal_arn} already has a cluster access entry "
                                 f"({CONFIG}cluster.accessEntries); give it the team namespace there or remove it"))
        if team.volume is not None:
            efs = cfg.storage.efs
            if cfg.platform != "eks" or efs is None:
                problems.append((f"{where}[{index}].volume", f"team {team.name}: a team volume is an access point "
                                                             f"on the stack's EFS ({CONFIG}storage.efs, EKS)"))
            elif f"{efs.storage_class.base_path}/".startswith(f"{TEAM_EFS_ROOT}/"):
                problems.append((f"{where}[{index}].volume",
                                 f"team {team.name}: {CONFIG}storage.efs.storageClass.basePath "
                                 f"{efs.storage_class.base_path} is under {TEAM_EFS_ROOT}, where the teams' own "
                                 "directories are; move it"))
    prefixes = {team.name: TeamPrefixes(reads=tuple(f"{d.bucket}/{d.prefix}" for d in team.datasets),
                                        writes=tuple(f"{d.bucket}/{d.prefix}" for d in team.checkpoints))
                for team in cfg.kueue.teams}
    for index, spec in enumerate(cfg.jobs):
        job_team = teams.get(spec.team) if spec.team is not None else None
        if spec.team is not None and (job_team is None or job_team.namespace is None):
            tenants = ", ".join(t.name for t in cfg.kueue.tenant_teams) or "none"
            problems.append((f"{CONFIG}jobs[{index}].team", f"{spec.team} is not a team with a namespace "
                                                            f"(teams with one: {tenants})"))
            continue
        # The same rule `submit render` applies with the prefixes the cluster facts publish.
        problems += [(f"{CONFIG}jobs[{index}].{path}", why)
                     for path, why in team_prefix_problems(spec, prefixes, buckets)]
        if job_team is not None and spec.queue is not None and spec.queue != job_team.name:
            problems.append((f"{CONFIG}jobs[{index}].queue", f"team {job_team.name}'s Jobs go through its LocalQueue "
                                                             f"{job_team.name}, not {spec.queue}"))
    return problems


def pool_zone_problems(cfg: StackConfig, private_zones: Sequence[str] | None) -> list[tuple[str, str]]:
    """A pool pinned to availability zones where the network has no private subnet cannot get nodes."""
    if private_zones is None:
        return []
    have = sorted(set(private_zones))
    problems = []
    for index, pool in enumerate(cfg.node_pools):
        if pool.instance_types and pool.availability_zones and not set(pool.availability_zones) & set(have):
            problems.append((f"{CONFIG}nodePools[{index}].availabilityZones",
                             f"node pool {pool.name}: no private subnet in {', '.join(pool.availability_zones)} "
                             f"(the network's private subnets are in {', '.join(have) or 'no zone'})"))
        reservation = pool.capacity_reservation
        if reservation is not None and reservation.availability_zone not in have:
            problems.append((f"{CONFIG}nodePools[{index}].capacityReservation.availabilityZone",
                             f"node pool {pool.name}: reservation {reservation.id} is in "
                             f"{reservation.availability_zone}, where the network has no private subnet (its private "
                             f"subnets are in {', '.join(have) or 'no zone'})"))
    return problems


def fsx_zone_problems(cfg: StackConfig, private_zones: Sequence[str] | None) -> list[tuple[str, str]]:
    """FSx for Lustre lives in one AZ: the network must have a private subnet there, and every pool that mounts it
    starts nodes only there (a Pod in another zone would cross zones, slower and billed per GB)."""
    fsx = cfg.storage.fsx_lustre
    if fsx is None or cfg.platform != "eks":
        return []
    where = f"{CONFIG}storage.fsxLustre"
    problems = []
    if private_zones is not None and fsx.availability_zone not in private_zones:
        problems.append((f"{where}.availabilityZone",
                         f"{fsx.availability_zone}: the network has no private subnet there (its private subnets are "
                         f"in {', '.join(sorted(set(private_zones))) or 'no zone'})"))
    pools = {pool.name: pool for pool in cfg.node_pools}
    for index, name in enumerate(fsx.node_pools):
        pool = pools.get(name)
        if pool is None:
            problems.append((f"{where}.nodePools[{index}]",
                             f"{name!r} is not a node pool of this stack (known: {', '.join(pools) or 'none'})"))
            continue
        zones = (pool.launch_zones(private_zones) if private_zones is not None
                 else pool.availability_zones or ([pool.capacity_reservation.availability_zone]
                                                  if pool.capacity_reservation is not None else []))
        elsewhere = sorted(set(zones) - {fsx.availability_zone})
        if elsewhere:
            problems.append((f"{where}.nodePools[{index}]",
                             f"node pool {name} starts nodes in {', '.join(elsewhere)}, the file system is in "
                             f"{fsx.availability_zone}: set the pool's availabilityZones: [{fsx.availability_zone}]"))
    problems += _fsx_team_problems(cfg, where)
    if fsx.efa and not any(pools[name].efa for name in fsx.node_pools if name in pools):
        problems.append((f"{where}.efa", f"true, but none of nodePools ({', '.join(fsx.node_pools)}) is an EFA pool "
                                         "(efa: true): no client would reach the file system over EFA"))
    return problems


def fsx_team_associations(cfg: StackConfig) -> list[tuple[str, FsxDataRepositoryAssociationConfig]]:
    """(team, the association that makes its /teams/<team> directory) per tenant team, with teamDirectories; a team
    without a checkpoints prefix gets none (fsx_zone_problems reports it)."""
    fsx = cfg.storage.fsx_lustre
    if fsx is None or not fsx.team_directories or not cfg.kueue.enabled:
        return []
    return [(team.name, fsx.team_association(team.name, team.checkpoints[0].bucket, team.checkpoints[0].prefix))
            for team in cfg.kueue.tenant_teams if team.checkpoints]


def fsx_team_claims(cfg: StackConfig) -> dict[str, tuple[str, ...]]:
    """Team -> the FSx claim in its namespace (its /teams/<team> directory), for the Jobs' team facts."""
    fsx = cfg.storage.fsx_lustre
    if fsx is None or cfg.platform != "eks":
        return {}
    return {team: (fsx.claim_name,) for team, _ in fsx_team_associations(cfg)}


def _fsx_team_problems(cfg: StackConfig, where: str) -> list[tuple[str, str]]:
    fsx = cfg.storage.fsx_lustre
    if fsx is None or not fsx.team_directories:
        return []
    teams = cfg.kueue.tenant_teams if cfg.kueue.enabled else []
    if not teams:
        return [(f"{where}.teamDirectories", "true, but no kueue team has a namespace (no tenant team to give a "
                                             "directory)")]
    problems = [(f"{where}.teamDirectories", f"team {team.name} has no checkpoints prefix: its directory "
                 f"{TEAM_FSX_ROOT}/{team.name} is linked to its first one (kueue.teams[].checkpoints)")
                for team in teams if not team.checkpoints]
    # The team's FSx directory is the claim claimName in its namespace: its EFS claim cannot share the name (one
    # object, and one name for two volumes in the team's facts).
    problems += [(f"{CONFIG}kueue.teams[{index}].volume.claim",
                  f"team {team.name}: {team.volume.claim!r} is also {where}.claimName, the claim of the team's "
                  f"directory {TEAM_FSX_ROOT}/{team.name} in namespace {team.namespace}: name the two claims apart")
                 for index, team in enumerate(cfg.kueue.teams)
                 if team in teams and team.checkpoints and team.volume is not None
                 and team.volume.claim == fsx.claim_name]
    for index, dra in enumerate(fsx.data_repository_associations):
        path = dra.file_system_path
        if path == TEAM_FSX_ROOT or path.startswith(TEAM_FSX_ROOT + "/"):
            problems.append((f"{where}.dataRepositoryAssociations[{index}].fileSystemPath",
                             f"{path} is under {TEAM_FSX_ROOT}, where teamDirectories puts the teams' directories"))
    return problems


def pool_release_problems(cfg: StackConfig) -> list[tuple[str, str]]:
    """An AL2023 AMI release names its Kubernetes minor (1.35.0-20251120): one of another minor than the cluster's
    cannot be given to the node group (EKS refuses it), nor survive a cluster upgrade unchanged."""
    if cfg.cluster is None:
        return []
    minor = cfg.cluster.kubernetes_version
    return [(f"{CONFIG}nodePools[{index}].releaseVersion",
             f"node pool {pool.name}: AL2023 release {pool.release_version} is for Kubernetes "
             f"{'.'.join(pool.release_version.split('.')[:2])}, the cluster runs {minor}: pin a {minor}.x release "
             "(or remove releaseVersion)")
            for index, pool in enumerate(cfg.node_pools)
            if pool.release_version is not None and pool.ami_family == "al2023"
            and not pool.release_version.startswith(f"{minor}.")]


def private_zones_from_config(cfg: StackConfig) -> list[str] | None:
    """The private subnets' zones when the stack creates its VPC (adopted subnets are looked up instead)."""
    if cfg.network is not None and cfg.network.create is not None:
        return list(cfg.network.create.availability_zones)
    return None


def installs_node_monitoring_agent(cfg: StackConfig) -> bool:
    """EKS stacks with a GPU pool run the node monitoring agent add-on unless gpu.nodeMonitoringAgent is off."""
    return NODE_MONITORING_AGENT in stack_addons(cfg)


def unpinned_addons_with_minimum(cfg: StackConfig) -> list[str]:
    """Add-ons the stack installs without a pin although only some versions work: their EKS default is looked up."""
    if cfg.platform != "eks":
        return []
    return sorted(name for name in MIN_ADDON_VERSIONS if name not in cfg.storage.addon_versions
                  and name not in cfg.storage.external_addons
                  and (name != NODE_MONITORING_AGENT or installs_node_monitoring_agent(cfg)))


def addon_default_problems(cfg: StackConfig, defaults: Mapping[str, str]) -> list[tuple[str, str]]:
    """`defaults`: add-on -> the version EKS installs when none is pinned (getAddonVersion, mostRecent false)."""
    problems = []
    for name, version in sorted(defaults.items()):
        minimum = MIN_ADDON_VERSIONS[name]
        if addon_semver(version) < minimum:
            problems.append((f"{CONFIG}storage.addonVersions",
                             f"EKS's default {name} for Kubernetes {cfg.kubernetes_version} is {version}, but "
                             f"{MIN_ADDON_WHY[name]} v{'.'.join(map(str, minimum))} or later: pin {name} to a "
                             f"v{minimum[0]} version (`aws eks describe-addon-versions --addon-name {name}` lists "
                             "them)"))
    return problems


def check_stack(cfg: StackConfig, stack: str, account_id: str | None = None,
                private_zones: Sequence[str] | None = None,
                job_manifests: Sequence[Sequence[dict[str, Any]]] = (),
                addon_defaults: Mapping[str, str] | None = None) -> JobBucketAccess:
    """Every cross-resource check; raises ConfigError with all problems found. Returns the Jobs' bucket access."""
    problems = check_stack_name(stack)
    if problems:  # every derived name would repeat the same complaint
        raise ConfigError(problems)
    problems += check_derived_names(derived_names(cfg, stack, account_id, job_manifests), stack)
    zones = private_zones if private_zones is not None else private_zones_from_config(cfg)
    problems += pool_zone_problems(cfg, zones)
    problems += fsx_zone_problems(cfg, zones)
    problems += pool_release_problems(cfg)
    problems += [(f"{CONFIG}storage.externalAddons.{name}", "not an add-on this stack installs: remove it")
                 for name in unused_external_addons(cfg)]
    access = job_bucket_access(cfg, stack, account_id)
    problems += access.problems
    problems += store_name_problems(cfg, stack, account_id)
    problems += team_problems(cfg, JOBS_NAMESPACE, job_bucket_names(cfg, stack, account_id))
    problems += addon_default_problems(cfg, addon_defaults or {})
    if problems:
        raise ConfigError(problems)
    return access
