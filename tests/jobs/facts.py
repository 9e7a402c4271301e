"""Cluster facts shaped like the stacks' clusters, for rendering Job specs without a plan."""

from __future__ import annotations

from workloads.cluster_facts import ClusterFacts, PoolFacts

GIB = 2**30


ACCOUNT = "210987654321"  # any account: nothing a spec says depends on it


def _registry(stack: str, region: str) -> str:
    return f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com/mlc-{stack}-train"


def _buckets(stack: str, *names: str) -> dict[str, str]:
    return {name: f"mlc-{stack}-{name}-{ACCOUNT}" for name in names}


def dev_facts() -> ClusterFacts:
    """dev: a CPU system pool and a g5.xlarge pool (1 A10G, 232 GiB NVMe)."""
    return ClusterFacts(stack="dev", label_prefix="ml-cluster.io", region="us-west-2",
                        image_repository=_registry("dev", "us-west-2"),
                        buckets=_buckets("dev", "datasets", "checkpoints"), pools=(
        PoolFacts("system", None, 0, 0),
        PoolFacts("gpu-a10g", "a10g", 1, 232, cpu_per_gpu_millicores=3500, memory_per_gpu_bytes=14 * GIB),
    ))


def prod_facts() -> ClusterFacts:
    """prod: p5.48xlarge (8 H100, 8 x 3.5 TiB NVMe) and p4d.24xlarge (8 A100, 8 x 1 TB NVMe)."""
    return ClusterFacts(stack="prod", label_prefix="ml-cluster.io", region="us-east-1",
                        image_repository=_registry("prod", "us-east-1"),
                        buckets=_buckets("prod", "datasets", "checkpoints", "results"), pools=(
        PoolFacts("system", None, 0, 0),
        PoolFacts("gpu-h100", "h100", 8, 28610, cpu_per_gpu_millicores=23000, memory_per_gpu_bytes=240 * GIB),
        PoolFacts("gpu-a100", "a100", 8, 7450, cpu_per_gpu_millicores=11500, memory_per_gpu_bytes=140 * GIB),
    ))


def onprem_facts() -> ClusterFacts:
    """onprem: an existing A100 cluster without instance store, objects on IBM COS through HMAC keys."""
    return ClusterFacts(stack="onprem", label_prefix="ml-cluster.io", pools=(
        PoolFacts("a100", "a100", 4, 0, cpu_per_gpu_millicores=8000, memory_per_gpu_bytes=100 * GIB),
        PoolFacts("a100-nvme", "a100", 8, 3000, cpu_per_gpu_millicores=8000, memory_per_gpu_bytes=100 * GIB),
    ), object_store_endpoint="https://s3.us-south.cloud-object-storage.appdomain.cloud",
        object_store_secret="cos-credentials")


ALL_FACTS = {"dev": dev_facts(), "prod": prod_facts(), "onprem": onprem_facts()}
