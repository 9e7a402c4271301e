"""More problems from a stack file that failed schema validation, so one error does not hide the others.

When `parse_stack_config` rejects a file, the checks that need the parsed config (instance-type facts of node
pools, looked up before any resource is registered) never run. `partial_stack_config` drops what failed (a node
pool with a bad field, an optional section) and validates the rest; the caller runs the pool checks on that and
reports their problems too, under the pools' original indices. Problems that follow from an already-reported one
are not added.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from infra.config.errors import ConfigError, config_path
from infra.config.schema import PLAINTEXT, SECRET_KEYS, StackConfig, config_values

# Sections a pool check does not need: dropped from the partial config when they fail validation.
_OPTIONAL = {"jobs", "storage", "gpu", "kueue", "monitoring", "tags", "labelPrefix", "protected", "kubeconfig",
             "cosHmacAccessKeyId", "cosHmacSecretAccessKey", "deploy", "accountId"}
# What other sections' checks read of a dropped one: with storage dropped the partial config has no buckets, so a
# Job's bucket would be "not one of this stack's buckets" only because of the error already reported.
_JOBS = r"^ml-cluster:(?:jobs\[\d+\]|jobControllers\.trainer\.stagedRuntimes\[\d+\])\."
_READS_DROPPED = {"storage": re.compile(_JOBS + r"(dataset|checkpoint)\b"),
                  "kueue": re.compile(_JOBS + r"(queue|team|workloadPriority|priorityClass)\b"),
                  "gpu": re.compile(_JOBS + r"(gpus|gpuType)\b")}


def partial_stack_config(raw: Mapping[str, Any]) -> tuple[StackConfig, list[int], set[str]] | None:
    """(config without the failing parts, original index of each kept node pool, the sections dropped), or None
    if what failed is needed by every check (platform, network, cluster...)."""
    ours = {name: PLAINTEXT if name in SECRET_KEYS and not isinstance(value, str) else value
            for name, value in config_values(raw).items()}
    pools = ours.get("nodePools")
    kept = list(range(len(pools))) if isinstance(pools, list) else []
    dropped: set[str] = set()
    for _ in range(6):
        try:
            return StackConfig.model_validate(ours), kept, dropped
        except ValidationError as exc:
            drop_pools: set[int] = set()
            for error in exc.errors():
                loc = error["loc"]
                top = loc[0] if loc else None
                if error["type"] == "extra_forbidden" and _drop_key(ours, loc):
                    continue  # an unknown key (reported already) says nothing about the rest of its section
                if top == "nodePools" and len(loc) > 1 and isinstance(loc[1], int) and isinstance(pools, list):
                    drop_pools.add(loc[1])
                elif top in _OPTIONAL:
                    ours.pop(str(top), None)
                    dropped.add(str(top))
                else:
                    return None
            pools = ours.get("nodePools")  # a copy, if an unknown key was dropped from a pool
            if drop_pools and isinstance(pools, list):
                pools = [pool for index, pool in enumerate(pools) if index not in drop_pools]
                kept = [original for index, original in enumerate(kept) if index not in drop_pools]
                ours["nodePools"] = pools
    return None


def _drop_key(values: dict[str, Any], loc: tuple[int | str, ...]) -> bool:
    """Remove the key at `loc` from `values` (copying the containers on the way, so `raw` stays as it was)."""
    if not loc:
        return False
    node: Any = values
    for part in loc[:-1]:
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list) or not isinstance(node[part], (dict, list)):
            return False
        node[part] = copy = type(node[part])(node[part])
        node = copy
    if not isinstance(node, dict) or loc[-1] not in node:
        return False
    del node[loc[-1]]
    return True


def _pool_index(path: str) -> int | None:
    match = re.match(r"^(?:ml-cluster:)?nodePools(?:\.|\[)(\d+)", path)
    return int(match.group(1)) if match else None


def _renumber(path: str, kept: list[int]) -> str:
    return re.sub(r"^((?:ml-cluster:)?nodePools(?:\.|\[))(\d+)", lambda m: f"{m.group(1)}{kept[int(m.group(2))]}",
                  path)


def more_pool_problems(raw: Mapping[str, Any], error: ConfigError, check: Any) -> list[tuple[str, str]]:
    """Problems `check(partial_config)` (infra.nodes.poolplan.plan_node_pools) finds in pools `error` said nothing
    of."""
    partial = partial_stack_config(raw)
    if partial is None:
        return []
    cfg, kept, _ = partial
    reported = {_pool_index(path) for path, _ in error.problems} - {None}
    try:
        check(cfg)
    except ConfigError as more:
        found: Iterable[tuple[str, str]] = more.problems
        extra = []
        for path, why in found:
            index = _pool_index(path)
            if index is None or index >= len(kept) or kept[index] in reported:
                continue  # only pool problems, and none about a pool already reported
            extra.append((_renumber(path, kept), why))
        return extra
    return []


def _section(path: str) -> str:
    """`ml-cluster:storage.buckets[1].name` -> `ml-cluster:storage.buckets[1]`: what one problem is about."""
    shown = config_path(path)
    match = re.match(r"^([^.\[]+(?:\.[A-Za-z]+)?(?:\[\d+\])?)", shown)
    return match.group(1) if match else shown


def more_stack_problems(raw: Mapping[str, Any], error: ConfigError, check: Any) -> list[tuple[str, str]]:
    """Problems `check(partial_config)` (infra.config.stackcheck.check_stack: names, zones, bucket access) finds
    in sections `error` said nothing of, with node pools under their original indices."""
    partial = partial_stack_config(raw)
    if partial is None:
        return []
    cfg, kept, dropped = partial
    reported = {_section(path) for path, _ in error.problems}
    consequences = [_READS_DROPPED[section] for section in dropped if section in _READS_DROPPED]
    try:
        check(cfg)
    except ConfigError as more:
        extra = []
        for path, why in more.problems:
            index = _pool_index(config_path(path))
            if index is not None:
                if index >= len(kept):
                    continue
                path = _renumber(config_path(path), kept)
            if _section(path) in reported or path == "stack":
                continue
            if any(rule.match(config_path(path)) for rule in consequences):
                continue  # follows from a section that failed and was dropped
            extra.append((path, why))
        return extra
    return []
