"""Each vendored chart package is what upstream published (or built from upstream's tag), and the check notices a
package that is not."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from scripts import vendored_charts
from scripts.vendored_charts import SOURCES, UPSTREAM, git_tree_id, package_tree, problems


def sources() -> dict[str, dict[str, str]]:
    return json.loads(SOURCES.read_text())["packages"]


def test_every_vendored_package_matches_its_recorded_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert problems(sources()) == []
    assert vendored_charts.main([]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {len(list(UPSTREAM.glob('*.tgz')))} vendored chart packages")


def test_the_tree_id_is_gits() -> None:
    # `printf 'a\n' > a; mkdir d; printf 'b\n' > d/b; git add -A; git write-tree` on an empty repository
    assert git_tree_id({"a": b"a\n", "d/b": b"b\n"}) == "c9b801068840df6bd9a0cd4efec5d00fafdbe36a"


def _package(files: dict[str, bytes], top: str = "chart") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


def test_a_subchart_package_counts_as_its_files_and_chart_lock_does_not() -> None:
    unpacked = _package({"Chart.yaml": b"name: x\n", "charts/sub/Chart.yaml": b"name: sub\n"})
    packed = _package({"Chart.yaml": b"name: x\n", "Chart.lock": b"generated: now\n",
                       "charts/sub-1.0.0.tgz": _package({"Chart.yaml": b"name: sub\n"}, top="sub")})
    assert package_tree(unpacked) == package_tree(packed)


def test_a_changed_a_missing_or_a_linked_package_is_an_error(tmp_path: Path) -> None:
    for path in UPSTREAM.glob("*.tgz"):
        shutil.copy(path, tmp_path / path.name)
    # a vendored build with one template changed: the tree no longer matches upstream's tag
    autoscaler = tmp_path / "cluster-autoscaler-9.59.0.tgz"
    with tarfile.open(autoscaler) as archive:
        files = {m.name.partition("/")[2]: archive.extractfile(m).read()  # type: ignore[union-attr]
                 for m in archive.getmembers() if m.isfile()}
    files["templates/deployment.yaml"] += b"\n# changed\n"
    autoscaler.write_bytes(_package(files, top="cluster-autoscaler"))
    # a re-released published package: other bytes under the same name
    (tmp_path / "csi-s3-0.43.7.tgz").write_bytes((tmp_path / "csi-s3-0.43.7.tgz").read_bytes() + b"\0")
    # a link in place of a package, and a package nobody recorded
    (tmp_path / "dcgm-exporter-4.8.2.tgz").unlink()
    (tmp_path / "dcgm-exporter-4.8.2.tgz").symlink_to(UPSTREAM / "dcgm-exporter-4.8.2.tgz")
    (tmp_path / "extra-1.0.0.tgz").write_bytes(b"not gzip")
    found = dict(problems(sources(), tmp_path))
    assert found.pop("extra-1.0.0.tgz") == "vendored but not in SOURCES.json"
    assert found.pop("vendored cluster-autoscaler-9.59.0.tgz").endswith(
        "the recorded source tree is 8db859290c7a6cea75d05648805217956db541ed")
    assert "upstream's is 74e4ab77" in found.pop("vendored csi-s3-0.43.7.tgz")
    assert found.pop("vendored dcgm-exporter-4.8.2.tgz") == "not a regular file"
    assert found == {}


def test_pulled_packages_are_compared_too(tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    shutil.copy(UPSTREAM / "nvidia-device-plugin-0.20.0.tgz", pulled)
    (pulled / "csi-s3-0.43.7.tgz").write_bytes(b"\x1f\x8b garbage")
    found = dict(problems(sources(), UPSTREAM, pulled))
    assert list(found) == ["pulled csi-s3-0.43.7.tgz"] and found["pulled csi-s3-0.43.7.tgz"].startswith(
        "sha256 ")
