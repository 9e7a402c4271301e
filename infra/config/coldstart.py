"""Stack config: the inputs of the cold-start budget (`ml-cluster:nodes.coldStart`) and image pulls on the nodes
(`ml-cluster:nodes.imagePull`).

A gang on a pool at size 0 waits for the instance to boot and join, the GPU burn-in, the images and its first data
before its pods are ready; Kueue evicts an admitted gang whose pods are not all ready within
`kueue.waitForPodsReady.timeout`. infra/nodes/coldstart.py adds the inputs up per GPU pool; a timeout below a pool's
budget is a config error. Every default below is a model figure or an upstream one, and says which.
"""

from __future__ import annotations

from pydantic import Field

from infra.config.base import Quantity, StrictModel

# Boot to Ready per instance family, in minutes: EC2 launch, the AMI's boot, nodeadm (with the NVMe RAID0), the
# kubelet's registration and the node's Ready. ASSUMPTIONS, not measurements: no published boot-to-Ready figure for
# these types was found (the EKS and EC2 guides give none). Large GPU types get more for the NVIDIA driver, EFA's
# interfaces and the RAID over 8 disks. Measure a real node (docs/operations.md, "Cold start") and set
# `bootMinutes`.
BOOT_MINUTES = {"p4d": 8.0, "p4de": 8.0, "p5": 10.0, "p5e": 10.0, "p5en": 10.0, "p6-b200": 10.0, "p6-b300": 10.0}
DEFAULT_BOOT_MINUTES = 5.0  # any other family: an assumption too
# Image pull rates, MB/s (10^6 bytes). From the AWS Containers blog "Introducing Seekable OCI Parallel Pull mode for
# Amazon EKS" as the project's issue quotes it (not re-read here): a 10.8 GB image in 112 s with containerd's default
# pull, 60 s with SOCI parallel pull on AL2023, 45 s on Bottlerocket. Upstream figures for one image and instance.
SERIAL_PULL_MB_S = round(10_800 / 112, 1)  # 96.4
AL2023_PARALLEL_PULL_MB_S = round(10_800 / 60, 1)  # 180.0
BOTTLEROCKET_PARALLEL_PULL_MB_S = round(10_800 / 45, 1)  # 240.0


class ImagePullConfig(StrictModel):
    """How GPU nodes pull images: SOCI parallel pull and unpack (AL2023: nodeadm's `FastImagePull` feature gate;
    Bottlerocket: the soci snapshotter in `parallel-pull-unpack` mode)."""

    parallel: bool = True
    ("parallel layer download and unpack on every AL2023 and Bottlerocket GPU pool (more CPU, memory and disk I/O "
     "while pulling; the pull lands on the NVMe RAID0 where the pool has one)")


class ColdStartConfig(StrictModel):
    """What a cold gang waits for, per GPU pool: boot, burn-in, image pulls, first data."""

    image_size: Quantity = "10G"
    ("the training image's size as pulled (`make image` prints it); default 10 GB, an assumption for a CUDA training "
     "image until you state yours")
    dcgm_image_size: Quantity = "1G"
    """NVIDIA's DCGM image the burn-in pulls (about 1 GB, docs/monitoring.md)"""
    boot_minutes: dict[str, float] = {}
    ("boot to Ready per instance family (p5, p4d, g5, ...), overriding the built-in assumptions (p4d 8, p5 and p6 10, "
     "other families 5 minutes)")
    burn_in_minutes: float | None = Field(default=None, ge=0)
    ("the burn-in from a node's Ready to its gpu-health label; None: from the checks the pool runs (model: DCGM diag "
     "level 1 one minute, level 2 five; GPU check one; EFA check half a minute)")
    serial_pull_mb_per_s: float = Field(default=SERIAL_PULL_MB_S, gt=0)
    """image pull rate without parallel pull, MB/s (upstream: 10.8 GB in 112 s)"""
    al2023_parallel_pull_mb_per_s: float = Field(default=AL2023_PARALLEL_PULL_MB_S, gt=0)
    """image pull rate with parallel pull on AL2023, MB/s (upstream: 10.8 GB in 60 s)"""
    bottlerocket_parallel_pull_mb_per_s: float = Field(default=BOTTLEROCKET_PARALLEL_PULL_MB_S, gt=0)
    """image pull rate with parallel pull on Bottlerocket, MB/s (upstream: 10.8 GB in 45 s)"""
    first_shard_seconds: int = Field(default=60, ge=0)
    ("from the trainer's start to its first batch of data (the first staged shard); an assumption, a cold stager's "
     "first GB")

    def boot(self, instance_type: str) -> float:
        family = instance_type.split(".", 1)[0]
        return self.boot_minutes.get(family, BOOT_MINUTES.get(family, DEFAULT_BOOT_MINUTES))
