"""Stack config: what applies to every node pool (`ml-cluster:nodes`): how the pools scale (`autoscaler`, the
cluster-autoscaler; infra/nodes/scaling/) and what each node holds back from pods (`sizing`, which the per-GPU
defaults and Kueue's quotas follow).

These were `ml-cluster:gpu.autoscaler` and `ml-cluster:gpu.sizing`; they apply to CPU pools as much as to GPU ones.
The old keys are still read: `StackConfig` moves them here (`move_renamed_keys`) and the program prints a `note:`
with the new spelling (`renamed_key_notes`). Setting both spellings of one key is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from infra.config.base import Quantity, StrictModel
from infra.config.coldstart import ColdStartConfig, ImagePullConfig
from infra.config.nodepools import HelmChartConfig

SECTION = "nodes"
# (old section, key) -> the key under `nodes`
RENAMED = {("gpu", "autoscaler"): "autoscaler", ("gpu", "sizing"): "sizing"}


class AutoscalerConfig(HelmChartConfig):
    chart_version: str = Field(default="9.59.0", pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    """https://kubernetes.github.io/autoscaler, chart cluster-autoscaler"""
    image_tag: str | None = Field(default=None, pattern=r"^v\d+\.\d+\.\d+$")
    """default: the newest cluster-autoscaler release of the control plane's minor"""
    expander: Literal["least-waste", "random", "most-pods", "priority", "price"] = "least-waste"
    """how the autoscaler picks a node group when several fit (cluster-autoscaler --expander)"""
    scale_down_unneeded_time: str = Field(default="10m", pattern=r"^\d+[smh]$")
    """how long a node stays unneeded before it is removed (e.g. 10m)"""
    balance_similar_node_groups: bool = True
    """keep similar node groups (e.g. one per zone) at similar sizes"""


class SizingConfig(StrictModel):
    """Per-node CPU and memory held back beyond kubelet's reservations (system daemons, node DaemonSets)."""

    system_reserved_cpu: Quantity = "500m"
    """CPU per node held back for system daemons and node DaemonSets"""
    system_reserved_memory: Quantity = "1Gi"
    """memory per node held back for system daemons and node DaemonSets"""


class NodesConfig(StrictModel):
    """Settings of every node pool: how the pools scale and what each node holds back from pods."""

    autoscaler: AutoscalerConfig = AutoscalerConfig()
    ("the cluster-autoscaler chart (EKS): scales node groups with pending pods, GPU pools from zero (formerly "
     "gpu.autoscaler)")
    image_pull: ImagePullConfig = ImagePullConfig()
    """parallel image pull on the GPU pools (nodeadm FastImagePull, Bottlerocket's soci snapshotter)"""
    cold_start: ColdStartConfig = ColdStartConfig()
    ("the cold-start budget's inputs (boot, burn-in, image sizes, pull rates, first shard): "
     "kueue.waitForPodsReady.timeout must cover each GPU pool's budget")
    sizing: SizingConfig = SizingConfig()
    ("what each node holds back from pods beyond the kubelet's reservations; the per-GPU defaults follow (formerly "
     "gpu.sizing)")


def move_renamed_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level config values (keys without the namespace) with each old spelling moved to its new place.

    Raises ValueError when a key is given under both spellings (which one was meant cannot be guessed)."""
    moved = dict(values)
    for (section, key), new_key in RENAMED.items():
        old = moved.get(section)
        if not isinstance(old, Mapping) or key not in old:
            continue
        new = moved.get(SECTION)
        new = dict(new) if isinstance(new, Mapping) else ({} if new is None else new)
        if not isinstance(new, dict):
            continue  # not a mapping: the schema reports it
        if new_key in new:
            raise ValueError(f"{section}.{key} and {SECTION}.{new_key} are one setting: keep {SECTION}.{new_key} "
                             f"and remove {section}.{key}")
        new[new_key] = old[key]
        moved[section] = {name: value for name, value in old.items() if name != key}
        moved[SECTION] = new
    return moved


def written_path(path: str, values: Mapping[str, Any], why: str) -> tuple[str, str]:
    """A problem's (path, why) under the spelling the file used: `nodes.autoscaler.expander` is reported as
    `gpu.autoscaler.expander` when the file still says gpu.autoscaler."""
    for (section, key), new_key in RENAMED.items():
        new = f"{SECTION}.{new_key}"
        old = values.get(section)
        if (path == new or path.startswith(new + ".")) and isinstance(old, Mapping) and key in old:
            return f"{section}.{key}{path[len(new):]}", why
    return path, why


def renamed_key_notes(raw: Mapping[str, Any], namespace: str = "ml-cluster:") -> list[str]:
    """One line per old spelling a stack's config (keys as in the stack file) still uses."""
    notes = []
    for (section, key), new_key in RENAMED.items():
        value = raw.get(f"{namespace}{section}")
        if isinstance(value, Mapping) and key in value:
            notes.append(f"{namespace}{section}.{key} is now {namespace}{SECTION}.{new_key} (it applies to every "
                         f"node pool); the old key still works: move it to the new one")
    return notes
