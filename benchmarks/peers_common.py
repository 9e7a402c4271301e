"""What every peer-benchmark contender shares (benchmarks/peers.py, peers_records.py): the batch and worker counts,
the measurement record, the input listing, the upload of a converted folder, and the peers' import shims."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads.data.format.jpeg import decode_bytes, decode_file
from workloads.data.moving.s3 import make_client

BATCH = 128
WORKERS = 2


@dataclass
class Measured:
    convert_s: float = 0.0  # conversion + upload
    first_batch_s: float = 0.0  # from creating the loader to holding the first batch (staging/download included)
    epoch_s: list[float] = field(default_factory=list)
    samples: int = 0


def samples_of(root: Path) -> list[tuple[Path, int]]:
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    return [(path, label) for label, name in enumerate(classes) for path in sorted((root / name).glob("*.jpg"))]


def upload_dir(ctx: Any, folder: Path, prefix: str) -> None:
    client = make_client(ctx.endpoint, 16, botocore_attempts=3)
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]

    def put(path: Path) -> None:
        client.upload_file(str(path), ctx.bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


class Mapped(torch.utils.data.IterableDataset):
    def __init__(self, inner: Any, fn: Callable[[Any], Any]) -> None:
        self.inner, self.fn = inner, fn

    def __iter__(self) -> Iterator[Any]:
        return map(self.fn, self.inner)


def stub_torchvision() -> None:
    """streaming.vision imports torchvision at package import; PyPI's torchvision wheels are CUDA builds that do not
    load beside the CPU torch used here, and nothing MDS reading does needs it. Only the two names it imports."""
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("torchvision") is not None:
        return
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules["torchvision.datasets"].VisionDataset = torch.utils.data.Dataset  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms.functional"].to_tensor = torch.as_tensor  # type: ignore[attr-defined]


def litdata_allow_http(_worker: int = 0) -> None:
    """litdata fetches chunks with obstore (Rust object_store), which refuses a plain-HTTP endpoint unless its client
    options say allow_http; litdata passes a fixed options dict, so it is amended in each (spawned) worker."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]


def litdata_stream(ctx: Any, fn: Callable[[Any], dict[str, Any]], inputs: list[Any],
                   transform: Callable[[dict[str, Any]], Any], started: float, run_epochs: Callable[..., Any]) -> Any:
    """LitData on one dataset, the same for every layout: `optimize` the inputs into chunks of the shard size, upload
    them, then StreamingDataset (its cache bounded to the budget's share of the chunks, as ours is) through
    StreamingDataLoader; the conversion is counted from `started`."""
    import litdata as ld

    out = Path(ctx.scratch) / "lit"
    ld.optimize(fn=fn, inputs=inputs, output_dir=str(out), chunk_bytes=ctx.shard_bytes, num_workers=WORKERS,
                mode="overwrite")
    limit = int(tree_bytes(out) * ctx.budget_fraction) if ctx.budget_fraction is not None else "100GB"
    upload_dir(ctx, out, "lit")
    measured = Measured(convert_s=time.perf_counter() - started)
    started = time.perf_counter()
    dataset = ld.StreamingDataset(f"s3://{ctx.bucket}/lit", shuffle=True, seed=0,
                                  cache_dir=str(Path(ctx.local) / "cache"),
                                  storage_options={"endpoint_url": ctx.endpoint}, transform=transform,
                                  max_cache_size=limit)
    loader = ld.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, persistent_workers=True,
                                    worker_init_fn=litdata_allow_http)
    return run_epochs(ctx, lambda _: loader, measured, started)


def tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # deleted while we walked
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


# -- what the image contenders store and decode (module level: DataLoader and litdata workers unpickle them) --
def payload(path: Path, layout: str, size: int) -> bytes:
    """What a peer stores per sample: the decoded pixels, or the JPEG file as it is."""
    return decode_file(path, size, draft=True).tobytes() if layout == "decoded" else path.read_bytes()


def pixels(payload: bytes | memoryview, layout: str, size: int) -> np.ndarray:
    if layout == "decoded":
        return np.frombuffer(payload, dtype=np.uint8).reshape(size, size, 3)
    return decode_bytes(payload, size, draft=True)


class Pixels:
    """Sample dict -> (uint8 tensor, label), in the worker (a module-level class: workers unpickle it)."""

    def __init__(self, layout: str, size: int) -> None:
        self.layout, self.size = layout, size

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(pixels(sample["image"], self.layout, self.size).copy()), int(sample["label"])


def lit_sample(item: tuple[str, int, str, int]) -> dict[str, Any]:
    path, label, layout, size = item
    return {"image": payload(Path(path), layout, size), "label": label}
