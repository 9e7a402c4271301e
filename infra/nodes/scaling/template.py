"""What cluster-autoscaler reads of a node it has not started yet: the node-template tag keys on a pool's Auto
Scaling group and the accelerator label that makes it count a node's GPUs.

Pure constants and one mapping, imported by the pool plan (infra/nodes/poolplan.py) to label GPU pools and to check
that every label fits a tag key; the tags themselves are built in infra/nodes/scaling/autoscaler.py.
"""

from __future__ import annotations

CAS_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"  # ASG tag prefix cluster-autoscaler reads
ASG_TAG_KEY_MAX = 128
# cluster-autoscaler (AWS) treats a node as a GPU node, and waits for its GPUs to register before it counts the
# scale-up as done, only when it carries this label (kubernetes/autoscaler cluster-autoscaler-1.33.0,
# cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go:38 GPULabel, :94 GetNodeGpuConfig).
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"


# cluster-autoscaler's AWS provider knows these values of ACCELERATOR_LABEL (availableGPUTypes,
# cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go:54-63 at tag cluster-autoscaler-1.36.1); a GPU it
# does not list (H100, H200, B200) gets the same "nvidia-<model>" form, which the autoscaler still counts as a GPU.
_AUTOSCALER_GPU_TYPES = {"k80": "nvidia-tesla-k80", "p100": "nvidia-tesla-p100", "v100": "nvidia-tesla-v100",
                         "t4": "nvidia-tesla-t4", "a100": "nvidia-tesla-a100", "a10g": "nvidia-a10g",
                         "l4": "nvidia-l4", "l40s": "nvidia-l40s"}


def accelerator_label_value(gpu_type: str) -> str:
    """The value of ACCELERATOR_LABEL for a gpu_type_label: "a10g" -> "nvidia-a10g", "v100" -> "nvidia-tesla-v100"."""
    return _AUTOSCALER_GPU_TYPES.get(gpu_type, f"nvidia-{gpu_type}")


def template_label_key(label: str) -> str:
    """The node-template tag key that models `label` on a pool's Auto Scaling group."""
    return f"{CAS_TEMPLATE}/label/{label}"
