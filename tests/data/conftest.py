"""Fixtures for the dataset tools: a moto S3 server on 127.0.0.1, image corpora, packed datasets."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data.helpers import write_corpus
from tests.moto_server import moto_server
from workloads.data.moving.s3 import make_client
from workloads.data.writing.pack import PackOptions, pack

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def moto_port() -> Iterator[int]:
    with moto_server() as url:
        yield int(url.rsplit(":", 1)[1])


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
    node = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())
    name = "data-" + (node[:24] + "-" + hashlib.sha256(node.encode()).hexdigest()[:12]).strip("-")
    make_client(s3_url, 4).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small decoded dataset in several shards (session-wide; tests must not modify it)."""
    source = tmp_path_factory.mktemp("corpus")
    write_corpus(source, per_class=12)
    out = tmp_path_factory.mktemp("packed")
    pack(source, out, PackOptions(layout="decoded", image_size=32, shard_bytes=20_000, workers=1, progress=False,
                                  shuffle_seed=None))
    return out
