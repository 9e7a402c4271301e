"""Shared helpers for the dataset-tool tests: image corpora, stage options, an uploaded dataset."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from workloads.data.moving.s3 import RetryPolicy, S3Uri, make_client
from workloads.data.moving.stage import StageOptions
from workloads.data.moving.upload import UploadOptions, upload


def _jpeg(image: Image.Image, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90, **kwargs)
    return buffer.getvalue()


def write_corpus(root: Path, per_class: int = 6, seed: int = 0) -> None:
    """Two classes of small random RGB JPEGs of varied shapes."""
    rng = np.random.default_rng(seed)
    for label in ("ants", "bees"):
        (root / label).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            height, width = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            (root / label / f"{index:03d}.jpg").write_bytes(_jpeg(Image.fromarray(pixels)))


def write_awkward_corpus(root: Path) -> dict[str, str]:
    """Every kind of image pack must convert, and every kind it must skip; returns {skipped path: reason word}."""
    # The unusable files sit inside the one class folder: a class of nothing but unusable files is refused.
    good, bad = root / "good", root / "good" / "bad"
    good.mkdir(parents=True)
    bad.mkdir(parents=True)
    (good / "rgb.jpg").write_bytes(_jpeg(Image.new("RGB", (64, 48), (200, 30, 30))))
    png = io.BytesIO()
    Image.new("RGBA", (50, 50), (0, 0, 255, 255)).save(png, format="PNG")
    (good / "rgba.png").write_bytes(png.getvalue())
    (good / "gray.jpg").write_bytes(_jpeg(Image.new("L", (40, 40), 128)))
    (good / "cmyk.jpg").write_bytes(_jpeg(Image.new("CMYK", (40, 40), (0, 255, 255, 0))))  # red in CMYK
    palette = Image.new("P", (40, 40), 1)
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)  # index 1 = green
    paletted = io.BytesIO()
    palette.save(paletted, format="PNG")
    (good / "palette.png").write_bytes(paletted.getvalue())
    # Stored landscape: left half red, right half blue; EXIF orientation 6 = rotate 90 degrees clockwise to view,
    # so the upright image is portrait with red on top.
    stored = Image.new("RGB", (80, 40), (255, 0, 0))
    stored.paste((0, 0, 255), (40, 0, 80, 40))
    exif = Image.Exif()
    exif[0x0112] = 6
    (good / "rotated.jpg").write_bytes(_jpeg(stored, exif=exif.tobytes()))

    sound = _jpeg(Image.new("RGB", (64, 48), (10, 200, 10)))
    (bad / "truncated.jpg").write_bytes(sound[: len(sound) // 2])
    (bad / "corrupt.jpg").write_bytes(sound[: len(sound) // 2] + bytes(range(256)) + sound[-2:])  # bad scan data
    (bad / "empty.jpg").write_bytes(b"")
    (bad / "notes.txt").write_text("not an image\n")
    return {"good/bad/corrupt.jpg": "corrupt", "good/bad/empty.jpg": "empty", "good/bad/notes.txt": "not an image",
            "good/bad/truncated.jpg": "corrupt"}


FAST_RETRY = RetryPolicy(attempts=6, base_delay_s=0.01, max_delay_s=0.05)


def stage_options(**overrides: object) -> StageOptions:
    values: dict = {"workers": 4, "part_bytes": 4096, "retry": FAST_RETRY, "progress": False}
    values.update(overrides)
    return StageOptions(**values)


def uploaded(packed: Path, s3_url: str, bucket: str) -> S3Uri:
    target = S3Uri(bucket, "sets/tiny")
    upload(make_client(s3_url, 4, botocore_attempts=3), packed, target, UploadOptions(workers=4, progress=False))
    return target


def shard_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*.h5"))}


def kill_pack_mid_shards(src: Path, out: Path, *options: str, temporaries: int = 1) -> None:
    """`python -m workloads.data pack SRC OUT` (48 px, 7 KiB shards, one worker, `options` added) killed with SIGKILL
    once `temporaries` temporary shards stand in OUT (within 60 s, before the pack finished)."""
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "workloads.data", "pack", str(src), str(out), "--size", "48",
               "--shard-size", "7KiB", "--workers", "1", "--no-progress", *options]
    process = subprocess.Popen(command, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and len(list(out.glob(".shard-*"))) < temporaries and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.poll() is None, "pack finished before it could be interrupted"
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
