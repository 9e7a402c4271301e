"""Tiny datasets for the training tests: a JPEG folder and its packed shards in both layouts.

The shards are written here by a minimal writer that follows workloads/data/format/manifest.py exactly (the real
packer is another module's concern); every sample's pixels carry its global index so tests can identify
samples exactly.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from workloads.data.format.jpeg import decode_bytes
from workloads.data.format.manifest import FORMAT_NAME, FORMAT_VERSION, Manifest, ShardInfo, shard_name, write_manifest

NUM_CLASSES = 3
PER_CLASS = 14
IMAGE_SIZE = 32
SHARD_SIZES = (17, 25)  # two shards, boundary inside a class


def _jpeg(index: int, rng: np.random.Generator) -> bytes:
    height, width = 40 + index % 5, 48 + index % 7
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    pixels[:8, :8] = (index * 37) % 256  # a flat patch that survives JPEG roughly; identity comes from `labels`
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _write_shards(root: Path, layout: str, payloads: list[bytes], labels: list[int], classes: list[str]) -> None:
    root.mkdir(parents=True)
    shards, first = [], 0
    for number, count in enumerate(SHARD_SIZES):
        path = root / shard_name(number)
        chunk, chunk_labels = payloads[first : first + count], labels[first : first + count]
        with h5py.File(path, "w") as handle:
            handle.attrs["format"] = FORMAT_NAME
            handle.attrs["format_version"] = FORMAT_VERSION
            handle.attrs["layout"] = layout
            if layout == "decoded":
                handle["images"] = np.stack([decode_bytes(p, IMAGE_SIZE, draft=False) for p in chunk])
            else:
                offsets = np.zeros(count + 1, dtype=np.int64)
                offsets[1:] = np.cumsum([len(p) for p in chunk])
                handle["data"] = np.frombuffer(b"".join(chunk), dtype=np.uint8)
                handle["offsets"] = offsets
            handle["labels"] = np.asarray(chunk_labels, dtype=np.int64)
        shards.append(
            ShardInfo(
                path=path.name,
                num_samples=count,
                first_index=first,
                bytes=path.stat().st_size,
                sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
            )
        )
        first += count
    write_manifest(
        root,
        Manifest(
            tool_version="test",
            layout=layout,  # type: ignore[arg-type]
            image_size=IMAGE_SIZE if layout == "decoded" else None,
            classes=classes,
            num_samples=first,
            shards=shards,
        ),
    )


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(7)
    classes = [f"class{c}" for c in range(NUM_CLASSES)]
    payloads, labels = [], []
    for label, name in enumerate(classes):
        (root / "folder" / name).mkdir(parents=True)
        for k in range(PER_CLASS):
            payload = _jpeg(len(payloads), rng)
            (root / "folder" / name / f"img{k:03d}.jpg").write_bytes(payload)
            payloads.append(payload)
            labels.append(label)
    assert len(payloads) == sum(SHARD_SIZES)
    _write_shards(root / "decoded", "decoded", payloads, labels, classes)
    _write_shards(root / "encoded", "encoded", payloads, labels, classes)
    return {"root": root, "folder": root / "folder", "decoded": root / "decoded", "encoded": root / "encoded"}


@pytest.fixture(autouse=True)
def _no_leaked_inductor_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch (2.13) sets TORCHINDUCTOR_CACHE_DIR in os.environ when an optimiser is built, so an in-process run
    would hand /tmp/torchinductor_<user> to every later subprocess of the same xdist worker (the read-only-root
    test then sees a write outside its mounts). Each test starts without it and leaves nothing behind."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
