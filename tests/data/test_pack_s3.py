"""pack from an s3:// source: class folders or a CSV/JSONL file list in a bucket, on a real moto server over HTTP.

The bar is the local pack: the same images in a local tree and in a bucket give byte-identical shards, manifest and
report, odd and unusable files included.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.data.helpers import write_awkward_corpus, write_corpus
from tests.data.test_pack_upload import cli, one_line
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.writing.pack import REPORT_NAME, PackOptions, pack
from workloads.data.writing.sources import S3Source, SourceOptions

COMMON = ["--size", "16", "--no-progress"]


def put_tree(s3_url: str, bucket: str, prefix: str, root: Path) -> None:
    """Every file below `root` as an object under `prefix`, and every empty folder as a folder marker."""
    client = make_client(s3_url, 4)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=path.read_bytes())
        elif not any(path.iterdir()):
            client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}/", Body=b"")


def dataset(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith("shard-")
            or p.name in (MANIFEST_NAME, REPORT_NAME)}


def write_odd_corpus(root: Path) -> None:
    """The awkward corpus plus a 16-bit PNG and a second class of plain JPEGs."""
    write_awkward_corpus(root)
    write_corpus(root, per_class=3)
    deep = np.linspace(0, 65535, 32 * 32).reshape(32, 32).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(deep).save(buffer, format="PNG")
    (root / "good" / "deep16.png").write_bytes(buffer.getvalue())


def source(s3_url: str, uri: str, **options: object) -> S3Source:
    from workloads.data.moving.s3 import parse_s3_uri

    return S3Source(make_client(s3_url, 32), parse_s3_uri(uri), SourceOptions(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize(("layout", "workers"), [("decoded", 2), ("encoded", 1)])
def test_class_folders_in_a_bucket_pack_like_the_local_tree(layout: str, workers: int, tmp_path: Path, s3_url: str,
                                                            bucket: str) -> None:
    write_odd_corpus(tmp_path / "src")
    put_tree(s3_url, bucket, "raw/imgs", tmp_path / "src")
    options = PackOptions(layout=layout, image_size=16, shard_bytes=4000, workers=workers,  # type: ignore[arg-type]
                          progress=False)
    local = pack(tmp_path / "src", tmp_path / "local", options)
    # Ranged GETs of 1 KiB: every object above that comes in several parts.
    remote = pack(source(s3_url, f"s3://{bucket}/raw/imgs", part_bytes=1024, fetch_workers=4), tmp_path / "s3",
                  options)
    assert dataset(tmp_path / "s3") == dataset(tmp_path / "local")
    assert len(local.manifest.shards) > 2 and remote.skipped == local.skipped
    assert {item["path"] for item in remote.skipped} == {"good/bad/corrupt.jpg", "good/bad/empty.jpg",
                                                         "good/bad/notes.txt", "good/bad/truncated.jpg"}


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_file_list_packs_like_the_class_folders_it_names(kind: str, tmp_path: Path, s3_url: str,
                                                           bucket: str) -> None:
    write_odd_corpus(tmp_path / "src")
    files = sorted(p.relative_to(tmp_path / "src").as_posix() for p in (tmp_path / "src").rglob("*") if p.is_file())
    # The objects under flat names; the list gives each its class (the folder it had), unordered.
    client = make_client(s3_url, 4)
    rows = []
    for rel in reversed(files):
        key = "flat/" + rel.replace("/", "__")
        client.put_object(Bucket=bucket, Key=f"lists/{key}", Body=(tmp_path / "src" / rel).read_bytes())
        rows.append((key, rel.split("/")[0]))

    def put_list(rows: list[tuple[str, str]]) -> None:
        if kind == "csv":
            body = "key,label\n" + "".join(f"{key},{label}\n" for key, label in rows)
        else:
            body = "".join(json.dumps({"key": key, "label": label}) + "\n" for key, label in rows)
        client.put_object(Bucket=bucket, Key=f"lists/train.{kind}", Body=body.encode())

    put_list(rows)
    options = PackOptions(image_size=16, shard_bytes=4000, workers=1, progress=False, shuffle_seed=None)
    local = pack(tmp_path / "src", tmp_path / "local", options)
    remote = pack(source(s3_url, f"s3://{bucket}/lists/train.{kind}"), tmp_path / "s3", options)
    assert [p.read_bytes() for p in sorted((tmp_path / "s3").glob("shard-*"))] == \
        [p.read_bytes() for p in sorted((tmp_path / "local").glob("shard-*"))]
    assert remote.manifest == local.manifest and len(remote.skipped) == len(local.skipped) == 4
    # A key that is not in the bucket is reported as unreadable, as a file deleted mid-pack is.
    put_list([*rows, ("flat/gone.jpg", "good")])
    gone = pack(source(s3_url, f"s3://{bucket}/lists/train.{kind}"), tmp_path / "gone", options)
    assert {"path": "flat/gone.jpg", "reason": "unreadable: object not found"} in gone.skipped
    assert gone.manifest.num_samples == local.manifest.num_samples


def test_an_empty_class_is_refused_as_locally(tmp_path: Path, s3_url: str, bucket: str) -> None:
    write_corpus(tmp_path / "src", per_class=2)
    (tmp_path / "src" / "wasps").mkdir()
    put_tree(s3_url, bucket, "raw", tmp_path / "src")
    options = PackOptions(image_size=16, workers=1, progress=False)
    with pytest.raises(DataToolError) as local:
        pack(tmp_path / "src", tmp_path / "local", options)
    with pytest.raises(DataToolError) as remote:
        pack(source(s3_url, f"s3://{bucket}/raw"), tmp_path / "s3", options)
    assert local.value.why == remote.value.why and "class folder has no usable images" in remote.value.why
    assert remote.value.where == f"s3://{bucket}/raw/wasps"
    assert not (tmp_path / "s3").exists()


def test_bad_file_lists_are_one_line_naming_the_row(tmp_path: Path, s3_url: str, bucket: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    client = make_client(s3_url, 4)
    for name, body, where, why in [
        ("a.csv", b"x.jpg,ants\ny.jpg\n", "a.csv:2", "expected 2 columns key,label, got 1"),
        ("b.csv", b"../x.jpg,ants\n", "b.csv:1", "is not an object key relative to the list's directory"),
        ("c.csv", b"x.jpg,ants\nx.jpg,bees\n", "c.csv:2", "is listed twice"),
        ("d.jsonl", b'{"key": "x.jpg", "label": "ants"}\n[1]\n', "d.jsonl:2", 'expected {"key"'),
        ("e.jsonl", b"{nope\n", "e.jsonl:1", "not JSON"),
    ]:
        client.put_object(Bucket=bucket, Key=name, Body=body)
        code, _, err = cli(["pack", f"s3://{bucket}/{name}", tmp_path / "out", *COMMON, "--endpoint-url", s3_url],
                           capsys)
        assert code == 2 and one_line(err) and err.startswith(f"error: s3://{bucket}/{where}: ") and why in err, err
    code, _, err = cli(["pack", f"s3://{bucket}/missing.csv", tmp_path / "out", *COMMON, "--endpoint-url", s3_url],
                       capsys)
    assert (code, err) == (2, f"error: s3://{bucket}/missing.csv: file list not found\n")
    assert not (tmp_path / "out").exists()


def test_missing_or_denied_bucket_is_one_line(tmp_path: Path, s3_url: str, bucket: str,
                                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, _, err = cli(["pack", "s3://no-such-bucket/imgs", tmp_path / "out", *COMMON, "--endpoint-url", s3_url],
                       capsys)
    assert (code, err) == (2, "error: s3://no-such-bucket/imgs: bucket does not exist\n")
    code, _, err = cli(["pack", f"s3://{bucket}/imgs", tmp_path / "out", *COMMON, "--endpoint-url", s3_url], capsys)
    assert (code, err) == (2, f"error: s3://{bucket}/imgs: no class sub-folders (expected SRC/<class>/<image "
                              "files>)\n")
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the in-process server now checks keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "UNKNOWNTESTKEY000000")
    code, _, err = cli(["pack", f"s3://{bucket}/imgs", tmp_path / "out", *COMMON, "--endpoint-url", s3_url], capsys)
    assert (code, err) == (2, f"error: s3://{bucket}/imgs: credentials rejected (InvalidAccessKeyId)\n")
    assert not (tmp_path / "out").exists()


def test_cli_packs_a_bucket_prefix(tmp_path: Path, s3_url: str, bucket: str, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=4)
    put_tree(s3_url, bucket, "imgs", tmp_path / "src")
    code, out, err = cli(["pack", f"s3://{bucket}/imgs", tmp_path / "out", *COMMON, "--workers", "2",
                          "--endpoint-url", s3_url, "--fetch-workers", "3"], capsys)
    assert code == 0, err
    assert out.startswith(f"packed 8 samples in 1 shards (decoded) into {tmp_path / 'out'}")
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "local", *COMMON, "--fetch-workers", "3"], capsys)
    assert (code, err) == (2, "error: --fetch-workers: only meaningful with an s3:// SRC\n")
    assert S3Uri(bucket, "imgs").key("x") == "imgs/x"


def test_a_listing_that_answers_500_once_is_retried_and_packs(tmp_path: Path, s3_url: str, bucket: str,
                                                             moto_port: int, capsys: pytest.CaptureFixture) -> None:
    """The listing's first GET answers 500 InternalError, the next 200: pack tries it again, as it does every GET
    (before: one line, exit 1, naming the InternalError)."""
    from benchmarks.netem import FaultProxy

    write_corpus(tmp_path / "src", per_class=2)
    put_tree(s3_url, bucket, "imgs", tmp_path / "src")
    with FaultProxy(moto_port, slowdown_every=1, max_faults=1, slowdown_status=500) as proxy:
        code, out, err = cli(["pack", f"s3://{bucket}/imgs", tmp_path / "out", *COMMON, "--workers", "1",
                              "--endpoint-url", proxy.url], capsys)
    assert code == 0, err
    assert proxy.counts.slowdowns == 1 and out.startswith("packed 4 samples in 1 shards")
    code, _, err = cli(["pack", f"s3://{bucket}/imgs", tmp_path / "direct", *COMMON, "--workers", "1",
                        "--endpoint-url", s3_url], capsys)
    assert code == 0 and dataset(tmp_path / "out") == dataset(tmp_path / "direct"), err


def test_a_listing_that_keeps_failing_gives_up_in_one_line(s3_url: str, bucket: str, moto_port: int) -> None:
    from benchmarks.netem import FaultProxy
    from workloads.data.moving.s3 import RetryPolicy, parse_s3_uri

    with FaultProxy(moto_port, slowdown_every=1, slowdown_status=500) as proxy, \
            pytest.raises(DataToolError) as failure:
        S3Source(make_client(proxy.url, 4), parse_s3_uri(f"s3://{bucket}/imgs"),
                 SourceOptions(retry=RetryPolicy(attempts=3, base_delay_s=0.01))).list_images()
    assert str(failure.value) == f"s3://{bucket}/imgs: gave up after 3 attempts: InternalError"
    assert failure.value.runtime and proxy.counts.slowdowns == 3


class PagedClient:
    """list_objects_v2 pages of a fixed listing, with a 500 on the first try of page 2 (what a client sees)."""

    def __init__(self, pages: list[dict[str, object]]) -> None:
        self.pages, self.calls, self.failed = pages, [], False

    def list_objects_v2(self, **request: object) -> dict[str, object]:
        from botocore.exceptions import ClientError

        self.calls.append(request.get("ContinuationToken"))
        index = 0 if "ContinuationToken" not in request else int(str(request["ContinuationToken"]).removeprefix("t"))
        if index == 1 and not self.failed:
            self.failed = True
            raise ClientError({"Error": {"Code": "InternalError", "Message": "try again"},
                               "ResponseMetadata": {"HTTPStatusCode": 500}}, "ListObjectsV2")
        return self.pages[index]


def test_every_page_of_the_listing_is_retried_and_a_truncated_page_without_a_token_is_one_line() -> None:
    from workloads.data.moving.s3 import RetryPolicy, parse_s3_uri

    options = SourceOptions(retry=RetryPolicy(attempts=2, base_delay_s=0.0))
    pages: list[dict[str, object]] = [
        {"Contents": [{"Key": "imgs/a/1.jpg", "Size": 3}], "IsTruncated": True, "NextContinuationToken": "t1"},
        {"Contents": [{"Key": "imgs/b/2.jpg", "Size": 4}], "IsTruncated": False}]
    client = PagedClient(pages)
    listing = S3Source(client, parse_s3_uri("s3://b/imgs"), options).list_images()
    assert listing.classes == ["a", "b"] and listing.sizes == {"a/1.jpg": 3, "b/2.jpg": 4}
    assert client.calls == [None, "t1", "t1"]  # page 2 asked again with its token after the 500
    pages[1] = {**pages[1], "IsTruncated": True}
    with pytest.raises(DataToolError) as failure:
        S3Source(PagedClient(pages), parse_s3_uri("s3://b/imgs"), options).list_images()
    assert str(failure.value) == "s3://b/imgs: the listing is truncated but names no new continuation token"
