"""Stack config: FSx for Lustre (`ml-cluster:storage.fsxLustre`).

One PERSISTENT_2 file system per stack, in one availability zone (the zone of the GPU pools that mount it), linked
to the stack's S3 buckets by data repository associations. Rules that need the rest of the stack (the platform,
the buckets, the node pools, the network's zones) are in `StorageConfig` / `StackConfig` / infra.config.stackcheck.

AWS's rules, as the FSx API Reference states them (CreateFileSystem, StorageCapacity): for SCRATCH_2, PERSISTENT_2
and PERSISTENT_1 on SSD "the valid values are 1200 GiB, 2400 GiB, and increments of 2400 GiB"; PerUnitStorageThroughput
for PERSISTENT_2 SSD is 125, 250, 500 or 1000 MB/s/TiB (CreateFileSystemLustreConfiguration).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import DnsLabel, StrictModel

_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_KMS_KEY_ARN = r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/.+$"
# PERSISTENT_2 (SSD): the throughput tiers AWS offers, MB/s per TiB of storage.
PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)
# PERSISTENT_2 (SSD): 1200 GiB, then 2400 GiB and increments of 2400 GiB.
CAPACITY_SMALLEST_GIB = 1200
CAPACITY_INCREMENT_GIB = 2400
# Where the tenant teams' directories live on the file system (storage.fsxLustre.teamDirectories): /teams/<team>.
TEAM_FSX_ROOT = "/teams"
FsxEvent = Literal["NEW", "CHANGED", "DELETED"]
ALL_EVENTS: list[FsxEvent] = ["NEW", "CHANGED", "DELETED"]


def capacity_problem(gib: int) -> str | None:
    """Why `gib` is not a PERSISTENT_2 SSD storage capacity, or None."""
    if gib == CAPACITY_SMALLEST_GIB or (gib >= CAPACITY_INCREMENT_GIB and gib % CAPACITY_INCREMENT_GIB == 0):
        return None
    lower = max(CAPACITY_SMALLEST_GIB, gib // CAPACITY_INCREMENT_GIB * CAPACITY_INCREMENT_GIB)
    upper = max(CAPACITY_INCREMENT_GIB, (gib // CAPACITY_INCREMENT_GIB + 1) * CAPACITY_INCREMENT_GIB)
    return (f"{gib} GiB is not a PERSISTENT_2 capacity (1200 GiB, 2400 GiB or a multiple of 2400 GiB; nearest: "
            f"{lower} or {upper})")


class FsxDataRepositoryAssociationConfig(StrictModel):
    """A link between a directory of the file system and a stack bucket (or a prefix of it)."""

    bucket: DnsLabel
    """the logical name of a bucket in storage.buckets (e.g. datasets)"""
    prefix: str = Field(default="", pattern=r"^([^/].*/)?$")
    """the S3 prefix linked (relative, ending in '/'); empty: the whole bucket"""
    file_system_path: str
    """the directory of the file system the bucket appears at, e.g. /datasets (never / itself)"""
    auto_import: list[FsxEvent] = ALL_EVENTS
    """S3 events the file system follows (NEW, CHANGED, DELETED); empty: no automatic import"""
    auto_export: list[FsxEvent] = []
    """file system changes written back to S3 (NEW, CHANGED, DELETED); empty: none, e.g. a read-mostly dataset"""
    import_metadata_on_create: bool = True
    """list the bucket's objects into the file system when the association is created"""
    imported_file_chunk_size_mib: int = Field(default=1024, ge=1, le=512000)
    """files imported from S3 are striped over storage servers in chunks of this size (MiB)"""

    @field_validator("file_system_path")
    @classmethod
    def _path(cls, value: str) -> str:
        parts = value.rstrip("/").split("/")
        if not value.startswith("/") or value.rstrip("/") == "" or ".." in parts or "" in parts[1:]:
            raise ValueError(f"{value!r}: fileSystemPath is an absolute directory below '/', e.g. /checkpoints")
        return value.rstrip("/")

    @field_validator("auto_import", "auto_export")
    @classmethod
    def _distinct(cls, events: list[str]) -> list[str]:
        if len(set(events)) != len(events):
            raise ValueError(f"events must be distinct: {events}")
        return events


class FsxMetadataConfig(StrictModel):
    mode: Literal["AUTOMATIC"] = "AUTOMATIC"
    """AUTOMATIC: FSx sizes the metadata IOPS with the storage capacity (PERSISTENT_2 only)"""


class FsxLustreConfig(StrictModel):
    """An FSx for Lustre file system for datasets and checkpoints of the multi-node Jobs (platform eks)."""

    deployment_type: Literal["PERSISTENT_2"] = "PERSISTENT_2"
    """PERSISTENT_2: replicated storage servers in one AZ, data repository associations, SSD"""
    storage_capacity: int = Field(ge=CAPACITY_SMALLEST_GIB)
    """GiB: 1200, 2400 or a multiple of 2400 (AWS's rule for PERSISTENT_2 SSD)"""
    per_unit_storage_throughput: int = 250
    """MB/s per TiB of storage: 125, 250, 500 or 1000 (the PERSISTENT_2 tiers; the price follows it)"""
    metadata_configuration: FsxMetadataConfig = FsxMetadataConfig()
    """how the metadata server's IOPS are provisioned"""
    availability_zone: str
    """the AZ of the file system's subnet: the zone of every node pool in nodePools"""
    node_pools: list[DnsLabel] = Field(min_length=1)
    ("the node pools whose Pods mount it; each must start nodes only in availabilityZone (pools elsewhere would cross "
     "zones: slower, and billed per GB)")
    kms_key_arn: str | None = Field(default=None, pattern=_KMS_KEY_ARN)
    """encryption at rest with this key; default: the AWS-managed aws/fsx key (always encrypted)"""
    data_compression: Literal["NONE", "LZ4"] = "LZ4"
    """LZ4: compress data on the storage servers (less storage used, same API)"""
    automatic_backup_retention_days: int = Field(default=7, ge=0, le=90)
    """daily automatic backups kept this many days; 0: none (the stack's dev default)"""
    claim_name: DnsLabel = "fsx-lustre"
    """the PVC in the Jobs' namespace (what a Job's dataset or checkpoint claimName names)"""
    mount_options: list[str] = ["flock"]
    """Lustre mount options of the PV (flock: POSIX locks, which torch.distributed's stores use)"""
    efa: bool = False
    ("an EFA-enabled file system (EFA and GPUDirect Storage; AWS recommends it above 10 GB/s): every traffic between "
     "it and the nodes allowed, and the EFA pools in nodePools configure their Lustre client for EFA at boot. Set at "
     "creation only; its throughput tier cannot change after")
    team_directories: bool = False
    ("each tenant team (kueue.teams with a namespace) gets its own directory /teams/<team>, linked by a data "
     "repository association (import and export) to its first checkpoints prefix, which creates it, and mounted alone "
     "by a static PV bound to the claim claimName in its namespace")
    data_repository_associations: list[FsxDataRepositoryAssociationConfig] = []
    """links of file system directories to the stack's buckets (import and/or export)"""

    @field_validator("storage_capacity")
    @classmethod
    def _capacity(cls, value: int) -> int:
        problem = capacity_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("per_unit_storage_throughput")
    @classmethod
    def _throughput(cls, value: int) -> int:
        if value not in PERSISTENT_2_THROUGHPUTS:
            raise ValueError(f"{value} MB/s/TiB is not a PERSISTENT_2 throughput tier (offered: "
                             f"{', '.join(map(str, PERSISTENT_2_THROUGHPUTS))})")
        return value

    @field_validator("availability_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not _AZ.match(value):
            raise ValueError(f"{value!r} is not an availability zone name like us-east-1a")
        return value

    @model_validator(mode="after")
    def _paths(self) -> FsxLustreConfig:
        paths = [dra.file_system_path for dra in self.data_repository_associations]
        for index, path in enumerate(paths):
            for other in paths[:index]:
                if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                    raise ValueError(f"fsxLustre.dataRepositoryAssociations[{index}].fileSystemPath: {path} overlaps "
                                     f"{other} (each association has a directory of its own)")
        return self

    def team_association(self, team: str, bucket: str, prefix: str) -> FsxDataRepositoryAssociationConfig:
        """The association that makes a team's directory: /teams/<team> <-> its checkpoints prefix, both ways."""
        return FsxDataRepositoryAssociationConfig(bucket=bucket, prefix=prefix,
                                                  file_system_path=f"{TEAM_FSX_ROOT}/{team}",
                                                  auto_import=list(ALL_EVENTS), auto_export=list(ALL_EVENTS))

    @property
    def throughput_mbps(self) -> int:
        """The file system's aggregate baseline throughput, MB/s (per-TiB tier x TiB of storage)."""
        return self.per_unit_storage_throughput * self.storage_capacity // 1024
