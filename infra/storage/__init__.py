"""Storage for training Jobs: EFS, FSx for Lustre, S3 / COS buckets, their drivers, StorageClasses and claims.

`Storage` composes the capability components (efs, fsx, buckets, drivers) and creates the Kubernetes objects that
classes.py builds. Other components read its plain attributes: bucket names/ARNs by logical name, the file
system, StorageClass and PVC names, the COS Secret for Jobs, and `driver_resources` to depend on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
from pydantic import SecretStr

from infra.config.addons import EBS_CSI_DRIVER, EFS_CSI_DRIVER, FSX_CSI_DRIVER, MOUNTPOINT_S3_CSI_DRIVER
from infra.config.fsx import FsxDataRepositoryAssociationConfig
from infra.config.storage import BucketConfig, StorageConfig
from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.storage import classes
from infra.storage.buckets import CosBuckets, CosBucketsArgs, S3Buckets, S3BucketsArgs
from infra.storage.drivers import (
    EksStorageDrivers,
    EksStorageDriversArgs,
    OnpremStorageDrivers,
    OnpremStorageDriversArgs,
)
from infra.storage.efs import SharedFileSystem, SharedFileSystemArgs
from infra.storage.fsx import LustreFileSystem, LustreFileSystemArgs, lustre_efa_client_script
from workloads.cluster_facts import FileSystemFacts

if TYPE_CHECKING:
    from infra.nodes.poolplan import PoolPlan

COS_JOB_SECRET = "cos-credentials"  # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for boto3 in Jobs (COS HMAC)


def s3_claim_name(bucket_key: str) -> str:
    return f"s3-{bucket_key}"


def cos_claim_name(bucket_key: str) -> str:
    return f"cos-{bucket_key}"


@dataclass(frozen=True)
class JobStorageFacts:
    """What Jobs need to know of the storage, derived from config alone (so Jobs are checked before any resource
    exists): the claims in the Jobs' namespace, and how to reach the S3-compatible store."""

    volume_claims: tuple[str, ...]
    object_store_endpoint: str | None
    object_store_secret: str | None
    file_systems: dict[str, FileSystemFacts] | None = None  # claim -> its provisioned-throughput file system


def job_storage_facts(config: StorageConfig, is_eks: bool) -> JobStorageFacts:
    claims = [s3_claim_name(b.name) for b in config.buckets if b.mount] if is_eks else []
    if config.cos is not None and not is_eks:
        claims += [cos_claim_name(b.name) for b in config.cos.buckets if b.mount]
    claims += [volume.name for volume in config.shared_volumes]
    if config.fsx_lustre is not None and is_eks:
        claims.append(config.fsx_lustre.claim_name)
    return JobStorageFacts(
        volume_claims=tuple(claims),
        object_store_endpoint=config.cos.endpoint if config.cos else None,
        object_store_secret=COS_JOB_SECRET if config.cos else None,
        file_systems=fsx_file_systems(config) if is_eks else None,
    )


def fsx_boot_scripts(config: StorageConfig, plans: Sequence[PoolPlan]) -> dict[str, tuple[str, ...]]:
    """Pool name -> the boot script that puts its Lustre client on EFA: the EFA pools (AL2023) that mount an
    EFA-enabled FSx for Lustre file system; {} otherwise (Bottlerocket pools keep TCP: no such script there)."""
    fsx = config.fsx_lustre
    if fsx is None or not fsx.efa:
        return {}
    return {plan.name: (lustre_efa_client_script(plan.efa_interfaces),) for plan in plans
            if plan.name in fsx.node_pools and plan.efa_interfaces and not plan.is_bottlerocket}


def fsx_file_systems(config: StorageConfig) -> dict[str, FileSystemFacts] | None:
    """The FSx for Lustre claim(s) and the throughput their writers share; None without FSx."""
    fsx = config.fsx_lustre
    if fsx is None:
        return None
    facts = FileSystemFacts(kind="fsx-lustre", per_unit_mbps=fsx.per_unit_storage_throughput,
                            capacity_gib=fsx.storage_capacity)
    return {fsx.claim_name: facts}


@dataclass(frozen=True)
class StorageArgs:
    config: StorageConfig
    cluster: ClusterInfo
    network: NetworkInfo | None  # None on onprem
    namespace: str  # the Jobs' namespace: claims and the COS Secrets live there
    namespace_resource: pulumi.Resource | None = None  # the Namespace object, when this stack creates it
    node_pools: Sequence[pulumi.Resource] = ()  # EKS add-ons only become ACTIVE once nodes can run their pods
    cos_access_key_id: SecretStr | None = None
    cos_secret_access_key: SecretStr | None = None
    fsx_team_associations: tuple[FsxDataRepositoryAssociationConfig, ...] = ()  # the teams' FSx directories


class Storage(pulumi.ComponentResource):
    def __init__(self, ctx: StackContext, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:Storage", ctx.name("storage", "all"), None, opts)
        config, cluster, namespace = args.config, args.cluster, args.namespace
        child = pulumi.ResourceOptions(parent=self)
        self.bucket_names: dict[str, pulumi.Output[str]] = {}
        self.bucket_arns: dict[str, pulumi.Output[str]] = {}
        self.file_system_id: pulumi.Output[str] | None = None
        self.file_system_arn: pulumi.Output[str] | None = None
        self.efs_security_group_id: pulumi.Output[str] | None = None
        self.fsx: LustreFileSystem | None = None
        self.config = config
        self.fsx_claims: list[dict[str, str]] = []  # the FSx claims verify_stack checks (namespace, name); teams add
        self.cos_secret_name: str | None = None
        self.object_store_endpoint: str | None = config.cos.endpoint if config.cos else None
        self.namespace = namespace
        self.driver_resources: list[pulumi.Resource] = []
        created = classes.CreatedObjects()
        in_namespace = [args.namespace_resource] if args.namespace_resource is not None else []

        def add(
            name: str, manifest: classes.Manifest, depends_on: list[pulumi.Resource], protect: bool = False
        ) -> None:
            created.resources.append(
                classes.create(ctx.name("storage", name), manifest, cluster, self, depends_on, protect)
            )

        # --- cloud resources ---
        efs = self._cloud_resources(ctx, args, child)

        # --- drivers ---
        mounted_s3 = [bucket for bucket in config.buckets if bucket.mount]
        drivers = self._drivers(ctx, args, efs is not None, mounted_s3, child)
        efs_driver, ebs_driver, s3_driver = drivers["efs"], drivers["ebs"], drivers["s3"]
        cos_driver, nfs_driver, fsx_driver = drivers["cos"], drivers["nfs"], drivers["fsx"]
        self.fsx_driver: list[pulumi.Resource] = fsx_driver

        # --- classes ---
        class_resources: dict[str, list[pulumi.Resource]] = {}

        def add_class(thing: str, manifest: classes.Manifest, driver: list[pulumi.Resource]) -> None:
            add(f"class-{thing}", manifest, driver)
            class_resources[manifest["metadata"]["name"]] = [created.resources[-1], *driver]
            created.storage_classes.append(manifest["metadata"]["name"])

        if config.gp3 is not None:
            add_class("gp3", classes.gp3_storage_class(config.gp3, ctx.tags), ebs_driver)
        if config.efs is not None and self.file_system_id is not None:
            add_class("efs", classes.efs_storage_class(config.efs.storage_class, self.file_system_id), efs_driver)
        if config.nfs is not None:
            add_class("nfs", classes.nfs_storage_class(config.nfs), nfs_driver)

        # --- object-store volumes ---
        for bucket in mounted_s3:
            claim = s3_claim_name(bucket.name)
            volume, pvc = classes.mountpoint_volume(
                claim,
                namespace,
                f"{ctx.prefix}-s3-{bucket.name}",
                self.bucket_names[bucket.name],
                ctx.region or "",
            )
            add(f"pv-{claim}", volume, s3_driver)
            add(f"pvc-{claim}", pvc, [*s3_driver, created.resources[-1], *in_namespace])
            created.dataset_claims[bucket.name] = claim
        if config.cos is not None:
            assert args.cos_access_key_id is not None and args.cos_secret_access_key is not None
            access_key = pulumi.Output.secret(args.cos_access_key_id.get_secret_value())
            secret_key = pulumi.Output.secret(args.cos_secret_access_key.get_secret_value())
            add(
                "secret-cos-jobs",
                classes.secret(
                    COS_JOB_SECRET,
                    namespace,
                    "Opaque",
                    {
                        "AWS_ACCESS_KEY_ID": access_key,
                        "AWS_SECRET_ACCESS_KEY": secret_key,
                        "AWS_ENDPOINT_URL": config.cos.endpoint,
                    },
                ),
                in_namespace,
            )
            self.cos_secret_name = COS_JOB_SECRET
            if not cluster.is_eks:
                self._cos_volumes(ctx, args, add, add_class, created, access_key, secret_key, cos_driver, in_namespace)

        for volume_config in config.shared_volumes:
            add(
                f"pvc-{volume_config.name}",
                classes.shared_claim(volume_config, namespace),
                [*class_resources[volume_config.storage_class], *in_namespace],
                protect=ctx.protected,
            )
            created.shared_claims.append(volume_config.name)

        if self.fsx is not None and config.fsx_lustre is not None:
            fsx_config = config.fsx_lustre
            volume, pvc = classes.fsx_volume(
                fsx_config.claim_name, namespace, self.fsx.file_system_id, self.fsx.dns_name, self.fsx.mount_name,
                fsx_config.storage_capacity, fsx_config.availability_zone, fsx_config.mount_options,
            )
            add(f"pv-{fsx_config.claim_name}", volume, [*fsx_driver, self.fsx], protect=ctx.protected)
            add(f"pvc-{fsx_config.claim_name}", pvc, [*fsx_driver, created.resources[-1], *in_namespace],
                protect=ctx.protected)
            created.shared_claims.append(fsx_config.claim_name)
            self.fsx_claims.append({"namespace": namespace, "name": fsx_config.claim_name})

        self.storage_class_names: list[str] = created.storage_classes
        self.dataset_claim_names: dict[str, str] = created.dataset_claims
        self.shared_claim_names: list[str] = created.shared_claims
        self.kubernetes_objects: list[pulumi.Resource] = created.resources
        self.register_outputs({"bucketNames": self.bucket_names, "storageClasses": self.storage_class_names})

    def fsx_team_volume(self, namespace: str, path: str) -> tuple[classes.Manifest, classes.Manifest,
                                                                  list[pulumi.Resource]]:
        """A team's FSx for Lustre directory (`path`, e.g. /teams/a) as a static PV that mounts only it
        (<dnsname>@tcp:/<mountname><path>: the FSx CSI driver mounts `mountname` as given, and Lustre mounts a
        subdirectory so) and the claim `claimName` in the team's namespace; with what they need first: the add-on
        and the association that makes the directory. Each PV has a volumeHandle of its own."""
        assert self.fsx is not None and self.config.fsx_lustre is not None
        fsx, config = self.fsx, self.config.fsx_lustre
        pv, pvc = classes.fsx_volume(
            config.claim_name, namespace, pulumi.Output.concat(fsx.file_system_id, ":", path), fsx.dns_name,
            pulumi.Output.concat(fsx.mount_name, path), config.storage_capacity, config.availability_zone,
            config.mount_options)
        return pv, pvc, [*self.fsx_driver, fsx.associations[path]]

    def _cloud_resources(self, ctx: StackContext, args: StorageArgs,
                         child: pulumi.ResourceOptions) -> SharedFileSystem | None:
        """EFS (with its security group and mount targets), the S3 buckets and the COS buckets."""
        config, cluster = args.config, args.cluster
        efs = None
        if config.efs is not None:
            if args.network is None or cluster.node_security_group_id is None:
                raise ValueError("storage.efs needs an EKS network and node security group")
            efs = SharedFileSystem(
                ctx, SharedFileSystemArgs(config.efs, args.network, cluster.node_security_group_id), child
            )
            self.file_system_id, self.file_system_arn = efs.file_system_id, efs.file_system_arn
            self.efs_security_group_id = efs.security_group_id
        if config.buckets:
            s3 = S3Buckets(ctx, S3BucketsArgs(config.buckets), child)
            self.bucket_names.update(s3.names)
            self.bucket_arns.update(s3.arns)
        if config.fsx_lustre is not None:
            if args.network is None or cluster.node_security_group_id is None:
                raise ValueError("storage.fsxLustre needs an EKS network and node security group")
            self.fsx = LustreFileSystem(ctx, LustreFileSystemArgs(
                config.fsx_lustre, args.network, cluster.node_security_group_id, dict(self.bucket_names),
                args.fsx_team_associations), child)
        if config.cos is not None:
            if args.cos_access_key_id is None or args.cos_secret_access_key is None:
                raise ValueError("storage.cos needs the COS HMAC secrets")
            cos = CosBuckets(ctx, CosBucketsArgs(config.cos, args.cos_access_key_id, args.cos_secret_access_key), child)
            self.bucket_names.update(cos.names)
        return efs

    def _drivers(self, ctx: StackContext, args: StorageArgs, has_efs: bool, mounted_s3: Sequence[BucketConfig],
                 child: pulumi.ResourceOptions) -> dict[str, list[pulumi.Resource]]:
        """The CSI add-ons (EKS) or the COS / NFS drivers (onprem); what each kind of volume waits for, by kind
        (efs, ebs, s3, cos, nfs, fsx)."""
        config, cluster = args.config, args.cluster
        found: dict[str, list[pulumi.Resource]] = {kind: [] for kind in ("efs", "ebs", "s3", "cos", "nfs", "fsx")}
        if cluster.is_eks:
            drivers = EksStorageDrivers(
                ctx,
                EksStorageDriversArgs(
                    config=config,
                    cluster=cluster,
                    file_system_arn=self.file_system_arn,
                    dataset_bucket_arns=[self.bucket_arns[bucket.name] for bucket in mounted_s3],
                    wait_for=args.node_pools,
                ),
                child,
            )
            self.driver_resources.extend(drivers.addons.values())
            found["efs"] = [drivers.addons[EFS_CSI_DRIVER]] if has_efs else []
            found["ebs"] = [drivers.addons[EBS_CSI_DRIVER]]
            found["s3"] = [drivers.addons[MOUNTPOINT_S3_CSI_DRIVER]]
            found["fsx"] = [drivers.addons[FSX_CSI_DRIVER]] if config.fsx_lustre is not None else []
        else:
            onprem = OnpremStorageDrivers(ctx, OnpremStorageDriversArgs(config=config, cluster=cluster), child)
            found["cos"] = [onprem.cos_driver] if onprem.cos_driver is not None else []
            found["nfs"] = [onprem.nfs_driver] if onprem.nfs_driver is not None else []
            self.driver_resources.extend(found["cos"] + found["nfs"])
        return found

    def _cos_volumes(
        self,
        ctx: StackContext,
        args: StorageArgs,
        add: Callable[..., None],
        add_class: Callable[..., None],
        created: classes.CreatedObjects,
        access_key: pulumi.Output[str],
        secret_key: pulumi.Output[str],
        cos_driver: list[pulumi.Resource],
        in_namespace: list[pulumi.Resource],
    ) -> None:
        cos, namespace = args.config.cos, args.namespace
        assert cos is not None
        if cos.driver == "ibm-flex":
            secret_type = "ibm/ibmc-s3fs"
            data: dict[str, pulumi.Input[str]] = {"access-key": access_key, "secret-key": secret_key}
            class_manifest = classes.cos_flex_storage_class(cos)
        else:
            secret_type = "Opaque"
            data = {"accessKeyID": access_key, "secretAccessKey": secret_key, "endpoint": cos.endpoint}
            class_manifest = classes.csi_s3_storage_class(cos, namespace)
        add("secret-cos-driver", classes.secret(cos.secret_name, namespace, secret_type, data), in_namespace)
        driver_secret = [created.resources[-1]]
        add_class("cos", class_manifest, cos_driver)
        cos_class = created.resources[-1]
        for bucket in cos.buckets:
            if not bucket.mount:
                continue
            claim = cos_claim_name(bucket.name)
            needs = [*cos_driver, cos_class, *driver_secret, *in_namespace]
            if cos.driver == "ibm-flex":
                add(
                    f"pvc-{claim}",
                    classes.cos_flex_claim(claim, namespace, self.bucket_names[bucket.name], cos),
                    needs,
                )
            else:
                volume, pvc = classes.csi_s3_volume(claim, namespace, self.bucket_names[bucket.name], cos)
                add(f"pv-{claim}", volume, needs)
                add(f"pvc-{claim}", pvc, [*needs, created.resources[-1]])
            created.dataset_claims[bucket.name] = claim

    def outputs(self, cluster: ClusterInfo, network: NetworkInfo | None) -> dict[str, pulumi.Input[object]]:
        """The `storage` stack output: what scripts/verify_stack.py checks after `pulumi up`."""
        efs: dict[str, pulumi.Input[object]] | None = None
        if self.file_system_id is not None and network is not None:
            efs = {
                "fileSystemId": self.file_system_id,
                "securityGroupId": self.efs_security_group_id,
                "nodeSecurityGroupId": cluster.node_security_group_id,
                "subnetIds": [subnet.id for subnet in network.private_subnets],
            }
        found: dict[str, pulumi.Input[object]] = {
            "efs": efs,
            "buckets": {key: name for key, name in self.bucket_names.items() if key in self.bucket_arns},
            "cosBuckets": {key: name for key, name in self.bucket_names.items() if key not in self.bucket_arns},
            "storageClasses": self.storage_class_names,
            "datasetClaims": self.dataset_claim_names,
            "sharedClaims": self.shared_claim_names,
            "cosSecret": self.cos_secret_name,
            "namespace": self.namespace,
        }
        if self.fsx is not None:  # only where the stack has one: other stacks' outputs stay as they were
            fsx = self.fsx
            found["fsxLustre"] = {"fileSystemId": fsx.file_system_id, "securityGroupId": fsx.security_group_id,
                                  "dnsName": fsx.dns_name, "mountName": fsx.mount_name,
                                  "associations": sorted(fsx.associations), "claims": self.fsx_claims}
        return found
