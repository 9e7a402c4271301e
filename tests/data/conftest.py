"""Fixtures for the dataset tools: a moto S3 server on 127.0.0.1, image corpora, packed datasets."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workloads.data.pack import PackOptions, pack
from workloads.data.s3 import make_client

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_port() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield port
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3_url(moto_port: int, aws_env: None) -> str:
    return f"http://127.0.0.1:{moto_port}"


@pytest.fixture
def bucket(s3_url: str, request: pytest.FixtureRequest) -> str:
    name = "data-" + request.node.name.replace("_", "-").lower()[:40].strip("-")
    make_client(s3_url, 4).create_bucket(Bucket=name)
    return name


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
    good, bad = root / "good", root / "bad"
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
    return {"bad/corrupt.jpg": "corrupt", "bad/empty.jpg": "empty", "bad/notes.txt": "not an image",
            "bad/truncated.jpg": "corrupt"}


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small decoded dataset in several shards (session-wide; tests must not modify it)."""
    source = tmp_path_factory.mktemp("corpus")
    write_corpus(source, per_class=12)
    out = tmp_path_factory.mktemp("packed")
    pack(source, out, PackOptions(layout="decoded", image_size=32, shard_bytes=20_000, workers=1, progress=False))
    return out
