"""Where pack's shards begin: decided from the source listing and the pack options alone.

The listing (every file's relative path, label and listed size, in pack's seeded order) is cut into shards before
anything is decoded, so shard k holds the usable images among inputs [starts[k], starts[k + 1]) whoever packs it:
one process, or slice i of N (pack --shard-index/--shard-count), whatever N is. A file found unusable makes its
shard smaller, never moves a boundary; a planned shard whose inputs are all unusable is simply absent (its name is
never used, the next shard keeps its own number).

    decoded   every usable input is S x S x 3 bytes: max(1, shard_bytes // (S * S * 3)) inputs a shard
    encoded   inputs are added while their listed sizes stay within shard_bytes (at least one a shard); a file
              pack re-encodes (PNG, CMYK, rotated) may come out a little larger or smaller than listed
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from workloads.data.format.manifest import FORMAT_VERSION, Layout


def plan_shards(files: Sequence[tuple[str, int]], sizes: dict[str, int], layout: Layout, image_size: int,
                shard_bytes: int) -> list[int]:
    """The input position at which each shard starts (starts[0] == 0; [] for no input)."""
    if not files:
        return []
    if layout == "decoded":
        per_shard = max(1, shard_bytes // (image_size * image_size * 3))
        return list(range(0, len(files), per_shard))
    starts, held = [0], 0
    for position, (relpath, _) in enumerate(files):
        size = sizes.get(relpath, 0)
        if position > starts[-1] and held + size > shard_bytes:
            starts.append(position)
            held = 0
        held += size
    return starts


def plan_id(tool_version: str, classes: Sequence[str], files: Sequence[tuple[str, int]], sizes: dict[str, int],
            layout: Layout, image_size: int, shard_bytes: int, shuffle_seed: int | None) -> str:
    """A digest of everything the shards depend on: slices that agree on it pack parts of one dataset."""
    digest = hashlib.sha256(json.dumps({
        "tool_version": tool_version, "format_version": FORMAT_VERSION, "layout": layout,
        "image_size": image_size if layout == "decoded" else None, "shard_bytes": shard_bytes,
        "shuffle_seed": shuffle_seed, "classes": list(classes)}, sort_keys=True).encode())
    for relpath, label in files:
        digest.update(json.dumps([label, sizes.get(relpath, 0), relpath]).encode() + b"\n")
    return digest.hexdigest()
