"""Stack config: storage (`ml-cluster:storage`).

EFS and its access-point StorageClass, the gp3 block class, S3 buckets (EKS), IBM COS / S3-compatible
buckets and the onprem object-store driver, an optional NFS class, and shared RWX volumes. Rules that need the
rest of the stack (platform, secrets) live in `StorageConfig.check_stack`, which StackConfig calls.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from infra.config.base import DnsLabel, Quantity, StrictModel, listed_twice
from infra.config.fsx import FsxLustreConfig

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_KMS_KEY_ARN = r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/.+$"
_HTTPS_URL = re.compile(r"^https://[A-Za-z0-9.-]+(:\d+)?/?$")

# EFS lifecycle policy values accepted by the EFS API (TransitionToIA).
EfsTransitionToIa = Literal[
    "AFTER_1_DAY",
    "AFTER_7_DAYS",
    "AFTER_14_DAYS",
    "AFTER_30_DAYS",
    "AFTER_60_DAYS",
    "AFTER_90_DAYS",
    "AFTER_180_DAYS",
    "AFTER_270_DAYS",
    "AFTER_365_DAYS",
]
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
AddonName = Literal[
    "aws-efs-csi-driver", "aws-ebs-csi-driver", "aws-mountpoint-s3-csi-driver", "eks-pod-identity-agent",
    "eks-node-monitoring-agent", "aws-fsx-csi-driver",
]
# An EKS add-on version as `aws eks describe-addon-versions` lists it.
AddonVersion = Annotated[str, Field(pattern=r"^v\d+\.\d+\.\d+-eksbuild\.\d+$")]
# Versions below which an add-on cannot do what this stack needs of it, and why:
# - Mountpoint for S3 supports Pod Identity from driver v2.0.0 (awslabs/mountpoint-s3-csi-driver CHANGELOG, v2.0.0);
# - the node monitoring agent reports the XID reasons the node groups' repair overrides name (NvidiaXID46Error,
#   62, 109, 110) from v1.6.4 (aws/eks-node-monitoring-agent monitors/nvidia/dcgm/dcgm_policies.go:27 at v1.6.3
#   and at v1.6.4; infra/nodes/repair.py).
MIN_ADDON_VERSIONS: dict[str, tuple[int, int, int]] = {
    "aws-mountpoint-s3-csi-driver": (2, 0, 0),
    NODE_MONITORING_AGENT: (1, 6, 4),
}
MIN_ADDON_WHY: dict[str, str] = {
    "aws-mountpoint-s3-csi-driver": "EKS Pod Identity needs driver",
    NODE_MONITORING_AGENT: "the GPU repair overrides name XID reasons of agent",
}


def addon_semver(version: str) -> tuple[int, int, int]:
    major, minor, patch = version[1:].split("-", 1)[0].split(".")
    return int(major), int(minor), int(patch)


def _bucket_name(value: str) -> str:
    if not _BUCKET_NAME.match(value) or ".." in value or value.startswith("xn--"):
        raise ValueError(f"{value!r} is not a valid bucket name (3-63 lower-case letters, digits, '.', '-')")
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return value
    raise ValueError(f"{value!r}: a bucket name must not look like an IP address")


def _object_prefix(value: str) -> str:
    if not value or value.startswith("/") or not value.endswith("/"):
        raise ValueError(f"{value!r}: an object prefix is relative and ends with '/', e.g. 'tmp/'")
    return value


BucketName = Annotated[str, AfterValidator(_bucket_name)]
ObjectPrefix = Annotated[str, AfterValidator(_object_prefix)]
# Logical bucket names become part of the physical name, so they stay short.
BucketKey = Annotated[DnsLabel, Field(max_length=24)]


class _BucketCommon(StrictModel):
    name: BucketKey
    """the logical name Job specs and other keys use (bucket: datasets); part of the default physical name"""
    bucket_name: BucketName | None = None
    """the physical bucket name; default: derived from the stack (and on S3 the account), see infra/storage"""
    versioning: bool = False
    """keep old versions of overwritten and deleted objects"""
    abort_incomplete_multipart_days: int = Field(default=7, ge=1, le=365)
    """multipart uploads left unfinished this long are aborted (their parts stop costing)"""
    scratch_prefixes: list[ObjectPrefix] = []
    """objects under these prefixes expire after scratchExpiryDays"""
    scratch_expiry_days: int = Field(default=7, ge=1, le=3650)
    """how long objects under scratchPrefixes live"""
    noncurrent_version_expiry_days: int | None = Field(default=None, ge=1, le=3650)
    """with versioning: old versions are deleted after this long; null: kept"""
    mount: bool = False
    ("a read-only PV and PVC of the bucket in the Jobs' namespace (Mountpoint for S3 on EKS, the COS driver on onprem)")

    @model_validator(mode="after")
    def _noncurrent_needs_versioning(self) -> _BucketCommon:
        if self.noncurrent_version_expiry_days is not None and not self.versioning:
            raise ValueError(f"bucket {self.name}: noncurrentVersionExpiryDays needs versioning: true")
        return self


class BucketConfig(_BucketCommon):
    """An S3 bucket (platform eks)."""

    encryption: Literal["AES256", "aws:kms"] = "AES256"
    """default encryption: AES256 (SSE-S3) or aws:kms (SSE-KMS)"""
    kms_key_arn: str | None = Field(default=None, pattern=_KMS_KEY_ARN)
    """with encryption aws:kms: the key; default: the AWS-managed aws/s3 key"""
    pack_into: bool = False
    ("dataset packs (`submit pack`) may write here: their own service account and role read every stack bucket and "
     "write only these (training Jobs never write datasets)")

    @model_validator(mode="after")
    def _kms(self) -> BucketConfig:
        if self.kms_key_arn is not None and self.encryption != "aws:kms":
            raise ValueError(
                f"bucket {self.name}: kmsKeyArn needs encryption: aws:kms (is {self.encryption})"
            )
        return self


class CosBucketConfig(_BucketCommon):
    """A bucket on IBM COS or another S3-compatible store (COS always encrypts at rest; no SSE settings)."""


class EfsStorageClassConfig(StrictModel):
    """The dynamic-provisioning class: one EFS access point (and directory) per PVC."""

    name: DnsLabel = "efs-ap"
    """the StorageClass's name (what sharedVolumes[].storageClass names)"""
    directory_perms: str = Field(default="700", pattern=r"^[0-7]{3,4}$")
    """permissions of each PVC's directory (octal)"""
    base_path: str = "/dynamic"
    """the directory under which the PVCs' directories are created (never /)"""
    uid: int | None = Field(default=1000, ge=0, le=2147483647)
    ("the POSIX user every access of a PVC's access point acts as (with gid; null: the EFS CSI driver picks one per "
     "access point)")
    gid: int | None = Field(default=1000, ge=0, le=2147483647)
    """the POSIX group every access of a PVC's access point acts as (with uid)"""
    sub_path_pattern: str = "${.PVC.namespace}/${.PVC.name}"
    """each PVC's directory under basePath (the EFS CSI driver's template)"""
    ensure_unique_directory: bool = True
    """append a unique suffix to each directory, so a re-created PVC never finds old data"""
    reclaim_policy: Literal["Delete", "Retain"] = "Delete"
    """Delete: a deleted PVC removes its access point and directory; Retain: both stay"""

    @field_validator("base_path")
    @classmethod
    def _base_path(cls, value: str) -> str:
        # basePath "/" puts every PVC's directory (and its deletion) at the root of the whole file system.
        if not value.startswith("/") or value.rstrip("/") == "" or ".." in value.split("/"):
            raise ValueError(f"{value!r}: basePath must be an absolute directory below '/', e.g. /dynamic")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _uid_gid(self) -> EfsStorageClassConfig:
        if (self.uid is None) != (self.gid is None):
            raise ValueError("efs.storageClass: set both uid and gid, or neither")
        return self


class EfsConfig(StrictModel):
    kms_key_arn: str | None = Field(default=None, pattern=_KMS_KEY_ARN)
    """default: the AWS-managed EFS key"""
    throughput_mode: Literal["elastic", "bursting", "provisioned"] = "elastic"
    """elastic: pay per use, scales with the load; bursting: credits by size; provisioned: provisionedThroughputMibps"""
    provisioned_throughput_mibps: int | None = Field(default=None, ge=1, le=10240)
    """the throughput bought, with throughputMode provisioned"""
    performance_mode: Literal["generalPurpose", "maxIO"] = "generalPurpose"
    """generalPurpose (lower latency) or maxIO (not with elastic throughput)"""
    transition_to_ia: EfsTransitionToIa | None = "AFTER_30_DAYS"
    """move files not read for this long to Infrequent Access (cheaper storage); null: never"""
    transition_to_primary_on_access: bool = True
    """move a file back to Standard on its first read from Infrequent Access"""
    backup: bool = True
    """AWS Backup's daily backups of the file system"""
    storage_class: EfsStorageClassConfig = EfsStorageClassConfig()
    """the StorageClass that gives each PVC its own access point and directory"""

    @model_validator(mode="after")
    def _throughput(self) -> EfsConfig:
        if (self.throughput_mode == "provisioned") != (self.provisioned_throughput_mibps is not None):
            raise ValueError(
                "efs: provisionedThroughputMibps is set exactly when throughputMode is provisioned"
            )
        if self.throughput_mode == "elastic" and self.performance_mode == "maxIO":
            raise ValueError("efs: throughputMode elastic does not support performanceMode maxIO")
        return self


class Gp3StorageClassConfig(StrictModel):
    name: DnsLabel = "gp3"
    """the StorageClass's name"""
    default: bool = True
    """annotated as the cluster's default StorageClass"""
    kms_key_arn: str | None = Field(default=None, pattern=_KMS_KEY_ARN)
    """default: the account's EBS key"""
    iops: int | None = Field(default=None, ge=3000, le=80000)
    """provisioned IOPS per volume; default: gp3's baseline 3000"""
    throughput_mibps: int | None = Field(default=None, ge=125, le=2000)
    """provisioned throughput per volume; default: gp3's baseline 125 MiB/s"""


class CosConfig(StrictModel):
    """IBM Cloud Object Storage (or another S3-compatible store), reached with the stack's HMAC keys."""

    endpoint: str
    """e.g. https://s3.us-south.cloud-object-storage.appdomain.cloud"""
    region: str = Field(default="us-south", pattern=r"^[a-z0-9-]+$")
    """the COS region (its location constraint is <region>-<tier>)"""
    tier: Literal["standard", "vault", "cold", "smart"] = "smart"
    """COS location constraint = <region>-<tier>; also the SigV4 signing region COS expects."""
    driver: Literal["ibm-flex", "csi-s3"] = "ibm-flex"
    """onprem: ibm-flex (IBM's s3fs flex driver chart) or csi-s3 (a CSI driver: flex volumes are deprecated)"""
    worker_os: Literal["debian", "redhat"] = "debian"
    ("ibm-flex: the OS family of the nodes (the chart's workerOS; its `helm ibmc` plugin reads it from the nodes' "
     "osImage: Red Hat/OpenShift -> redhat, anything else, e.g. Ubuntu/DGX OS -> debian).")
    storage_class_name: DnsLabel = "cos-s3fs"
    """onprem: the StorageClass of the COS volumes"""
    secret_name: DnsLabel = "cos-hmac"
    """onprem: the Secret with the HMAC keys the COS driver reads"""
    buckets: list[CosBucketConfig] = []
    """the COS buckets the stack creates"""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not _HTTPS_URL.match(value):
            raise ValueError(f"{value!r} is not an https:// endpoint URL (scheme and host, no path)")
        return value.rstrip("/")

    @property
    def location_constraint(self) -> str:
        return f"{self.region}-{self.tier}"


class NfsConfig(StrictModel):
    server: str = Field(pattern=r"^[A-Za-z0-9.:-]+$")
    """the NFS server's host name or address"""
    share: str = Field(default="/", pattern=r"^/")
    """the exported path"""
    storage_class_name: DnsLabel = "nfs"
    """the StorageClass's name (what sharedVolumes[].storageClass names)"""
    mount_options: list[str] = ["nfsvers=4.1"]
    """NFS mount options of the volumes"""
    reclaim_policy: Literal["Delete", "Retain"] = "Retain"
    """Retain: a deleted PVC leaves its directory; Delete: it is removed"""


class SharedVolumeConfig(StrictModel):
    """A ReadWriteMany PVC in the jobs namespace, e.g. for datasets or checkpoints on EFS."""

    name: DnsLabel
    """the PVC's name (what a Job's claimName names)"""
    storage_class: DnsLabel
    """a ReadWriteMany class of this stack (the EFS class or nfs)"""
    size: Quantity = "1Ti"
    """EFS ignores it (elastic), but a PVC must request something"""


class StorageConfig(StrictModel):
    efs: EfsConfig | None = None
    """EKS only"""
    gp3: Gp3StorageClassConfig | None = None
    """EKS only (EBS CSI)"""
    buckets: list[BucketConfig] = []
    """S3; EKS only"""
    fsx_lustre: FsxLustreConfig | None = None
    """an FSx for Lustre file system linked to the stack's buckets, mounted by a static PVC; EKS only"""
    cos: CosConfig | None = None
    """IBM Cloud Object Storage (or another S3-compatible store) and its buckets, reached with the HMAC keys"""
    nfs: NfsConfig | None = None
    """an existing NFS server as a ReadWriteMany StorageClass (csi-driver-nfs)"""
    shared_volumes: list[SharedVolumeConfig] = []
    """ReadWriteMany PVCs in the Jobs' namespace (datasets, checkpoints), on the EFS or NFS class"""
    addon_versions: dict[AddonName, AddonVersion] = {}
    """pin EKS add-on versions (vX.Y.Z-eksbuild.N); default: EKS's default for the cluster"""

    external_addons: dict[AddonName, AddonVersion] = {}
    ("EKS add-ons an existing cluster already runs and keeps, at the version it runs (aws eks describe-addon): the "
     "stack installs none of them and creates no role or Pod Identity association for them (their own must allow the "
     "stack's file system and buckets); preflight FAILs when another version runs")

    @field_validator("addon_versions", "external_addons")
    @classmethod
    def _addon_minimums(cls, versions: dict[str, str]) -> dict[str, str]:
        for name, version in versions.items():
            minimum = MIN_ADDON_VERSIONS.get(name)
            if minimum is not None and addon_semver(version) < minimum:
                raise ValueError(f"{name} {version}: {MIN_ADDON_WHY[name]} v{'.'.join(map(str, minimum))} or later")
        return versions

    @model_validator(mode="after")
    def _references(self) -> StorageConfig:
        both = sorted(set(self.addon_versions) & set(self.external_addons))
        if both:
            raise ValueError(f"{', '.join(both)}: in addonVersions (the stack installs it) and externalAddons (the "
                             "cluster keeps its own): name it in one")
        keys = [bucket.name for bucket in self.buckets] + [
            bucket.name for bucket in (self.cos.buckets if self.cos else [])
        ]
        duplicates = listed_twice(keys)
        if duplicates:
            raise ValueError(
                f"storage bucket names must be unique across buckets and cos.buckets: {duplicates}"
            )
        volume_names = [volume.name for volume in self.shared_volumes]
        duplicate_volumes = listed_twice(volume_names)
        if duplicate_volumes:
            raise ValueError(f"storage.sharedVolumes names must be unique: {duplicate_volumes}")
        self._fsx_references()
        rwx_classes = self.rwx_class_names()
        for index, volume in enumerate(self.shared_volumes):
            if volume.storage_class not in rwx_classes:
                known = ", ".join(sorted(rwx_classes)) or "none configured"
                raise ValueError(
                    f"storage.sharedVolumes[{index}].storageClass: {volume.storage_class!r} is not a "
                    "ReadWriteMany "
                    f"class of this stack (known: {known})"
                )
        return self

    def _fsx_references(self) -> None:
        fsx = self.fsx_lustre
        if fsx is None:
            return
        buckets = [bucket.name for bucket in self.buckets]
        for index, dra in enumerate(fsx.data_repository_associations):
            if dra.bucket not in buckets:
                raise ValueError(
                    f"storage.fsxLustre.dataRepositoryAssociations[{index}].bucket: {dra.bucket!r} is not a bucket "
                    f"of this stack's storage.buckets (known: {', '.join(buckets) or 'none'})"
                )
        if fsx.claim_name in [volume.name for volume in self.shared_volumes]:
            raise ValueError(f"storage.fsxLustre.claimName: {fsx.claim_name!r} is also a sharedVolumes name")

    def rwx_class_names(self) -> set[str]:
        """StorageClasses this config creates that can back ReadWriteMany volumes."""
        names = set()
        if self.efs is not None:
            names.add(self.efs.storage_class.name)
        if self.nfs is not None:
            names.add(self.nfs.storage_class_name)
        return names

    def class_names(self) -> set[str]:
        names = self.rwx_class_names()
        if self.gp3 is not None:
            names.add(self.gp3.name)
        if self.cos is not None:
            names.add(self.cos.storage_class_name)
        return names

    def check_stack(self, platform: str, has_cos_keys: bool) -> None:
        """Rules that need the rest of the stack config; raises ValueError naming the fields."""
        if platform != "eks":
            aws_only = [
                key
                for key, value in (("efs", self.efs), ("gp3", self.gp3), ("buckets", self.buckets),
                                   ("fsxLustre", self.fsx_lustre))
                if value
            ]
            if aws_only:
                raise ValueError(
                    f"storage.{', storage.'.join(aws_only)}: needs platform eks (is {platform}); "
                    "onprem object storage goes in storage.cos"
                )
        elif self.cos is not None and any(bucket.mount for bucket in self.cos.buckets):
            raise ValueError("storage.cos.buckets: mount: true needs the onprem COS driver (platform onprem)")
        if self.cos is not None and not has_cos_keys:
            raise ValueError(
                "storage.cos needs the secrets ml-cluster:cosHmacAccessKeyId and "
                "ml-cluster:cosHmacSecretAccessKey"
            )
