"""Stage the sources of a mixture into one directory with one budget: `stage URI0 URI1 ... DEST`.

Source k lands in DEST/k/ (its manifest.json and shards, as `stage` lays out one dataset), and one stager serves
them all through DEST/.cache/ (the protocol of workloads/data/moving/cache.py), with shard names relative to DEST
("0/shard-00000.h5"). So the budget is shared: the reader's plan lists the shards of every source in the order the
mixture first uses them (reading/mixture.py), and the stager keeps the longest prefix of that plan that fits,
whichever source each shard belongs to. `source_cache` gives source k's reader its view of the shared cache.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from workloads.data.moving.cache import CacheReader, StagerState
from workloads.data.moving.metrics import StageMetrics
from workloads.data.moving.s3 import S3Uri
from workloads.data.moving.stage import (
    ShardStager,
    StageOptions,
    StageResult,
    check_budget,
    fetch_manifest,
    run_stager,
)


def source_dir(dest: str | Path, source: int) -> Path:
    """Where source k of a mixture staged into DEST lives."""
    return Path(dest) / str(source)


class _MixtureStager(ShardStager):
    def __init__(self, client: Any, sources: list[S3Uri], dest: Path, manifest: Manifest,
                 options: StageOptions) -> None:
        super().__init__(client, sources[0], dest, manifest, options)
        self.sources = sources

    def object_of(self, name: str) -> tuple[str, str]:
        source, _, path = name.partition("/")
        uri = self.sources[int(source)]
        return uri.bucket, uri.key(path)


def combined_manifest(manifests: list[Manifest]) -> Manifest:
    """One manifest naming every source's shards as k/<shard> (what the stager fetches and the plan names)."""
    shards, first = [], 0
    for number, manifest in enumerate(manifests):
        for shard in manifest.shards:
            # Constructed, not validated: a shard name here is a path (one folder per source).
            shards.append(ShardInfo.model_construct(path=f"{number}/{shard.path}", num_samples=shard.num_samples,
                                                    first_index=first, bytes=shard.bytes, sha256=shard.sha256))
            first += shard.num_samples
    return manifests[0].model_copy(update={"shards": shards, "num_samples": first})


def stage_mixture(client: Any, sources: list[S3Uri], dest: Path, options: StageOptions) -> StageResult:
    """Stage every source into DEST/k/ through one stager (one budget, one plan)."""
    if len(sources) < 2:
        raise DataToolError("uri", "a mixture stages two or more sources")
    metrics = options.metrics or StageMetrics()
    options = replace(options, metrics=metrics)
    fetched = [fetch_manifest(client, uri, options.retry, metrics.retries.inc) for uri in sources]
    manifest = combined_manifest([m for m, _ in fetched])
    check_budget(manifest, options.budget_bytes)
    stager = _MixtureStager(client, sources, dest, manifest, options)
    return run_stager(stager, {f"{k}/{MANIFEST_NAME}": payload for k, (_, payload) in enumerate(fetched)})


class SourceCache:
    """Source k's view of a mixture's shared staging cache: its shard names without the "k/" prefix (what
    HDF5Dataset asks for) mapped onto the stager's names. Picklable, like CacheReader (DataLoader workers)."""

    def __init__(self, reader: CacheReader, source: int) -> None:
        self.reader = reader
        self.prefix = f"{source}/"

    @property
    def dest(self) -> Path:
        return self.reader.dest

    def state(self) -> StagerState | None:
        return self.reader.state()

    def ready(self) -> set[str]:
        return {name[len(self.prefix):] for name in self.reader.ready() if name.startswith(self.prefix)}

    def is_ready(self, name: str) -> bool:
        return self.reader.is_ready(self.prefix + name)

    def wait_ready(self, name: str, timeout: float | None = None) -> Path:
        return self.reader.wait_ready(self.prefix + name, timeout=timeout)
