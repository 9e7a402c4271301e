from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from PIL import Image

from tests.data.helpers import kill_pack_mid_shards, write_awkward_corpus, write_corpus
from workloads.data.__main__ import main
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import load_manifest
from workloads.data.format.verify import verify
from workloads.data.writing.pack import PackOptions, list_images, pack
from workloads.data.writing.samples import local_samples

REPO = Path(__file__).resolve().parents[2]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_pack_is_deterministic_across_worker_counts(tmp_path: Path, layout: str) -> None:
    write_corpus(tmp_path / "src", per_class=8)
    one = pack(tmp_path / "src", tmp_path / "one", PackOptions(layout=layout, image_size=24, shard_bytes=8000,
                                                               workers=1, progress=False))
    pack(tmp_path / "src", tmp_path / "two", PackOptions(layout=layout, image_size=24, shard_bytes=8000,
                                                               workers=2, progress=False))
    assert len(one.manifest.shards) > 1
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    assert verify(tmp_path / "one").num_samples == 16


def test_decoding_stays_a_bounded_distance_ahead_of_the_writer(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that waits (a slow disk, an upload applying back-pressure) must stop the decoders too, or every
    decoded sample piles up in memory."""
    write_corpus(tmp_path / "src", per_class=100)
    _, files = list_images(tmp_path / "src")
    submitted: list[int] = []
    real_submit = ProcessPoolExecutor.submit

    def counting_submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        submitted.append(len(args[0]))
        return real_submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counting_submit)
    samples = local_samples(tmp_path / "src", files, PackOptions(image_size=8, workers=2, progress=False).decoding)
    first = next(samples)
    assert len(submitted) <= 2 * 2  # two chunks per worker
    rest = list(samples)
    assert [s.relpath for s in [first, *rest]] == [rel for rel, _ in files]  # still in input order
    assert len(submitted) > 2 * 2 and sum(submitted) == len(files)


def test_default_order_interleaves_classes_deterministically(tmp_path: Path) -> None:
    write_corpus(tmp_path / "src", per_class=12)
    options = PackOptions(image_size=16, shard_bytes=8 * 16 * 16 * 3, workers=1, progress=False)
    first = pack(tmp_path / "src", tmp_path / "a", options).manifest
    again = pack(tmp_path / "src", tmp_path / "b", options).manifest
    assert first.shuffle_seed == 0 and [s.sha256 for s in first.shards] == [s.sha256 for s in again.shards]
    per_shard = [h5py.File(tmp_path / "a" / s.path)["labels"][...].tolist() for s in first.shards]
    assert sorted(label for labels in per_shard for label in labels) == [0] * 12 + [1] * 12
    # A run of two shards (a small rolling window) already holds both classes; sorted order would not.
    assert all({0, 1} <= set(per_shard[i] + per_shard[i + 1]) for i in range(len(per_shard) - 1))
    other = pack(tmp_path / "src", tmp_path / "c", PackOptions(**{**options.__dict__, "shuffle_seed": 1})).manifest
    assert [s.sha256 for s in other.shards] != [s.sha256 for s in first.shards]


def test_awkward_images_are_converted_and_bad_files_reported(tmp_path: Path) -> None:
    expected_skips = write_awkward_corpus(tmp_path / "src")
    result = pack(tmp_path / "src", tmp_path / "out", PackOptions(image_size=16, workers=2, progress=False,
                                                                                shuffle_seed=None))
    manifest = result.manifest
    assert manifest.classes == ["good"]
    assert manifest.num_samples == 6 and manifest.skipped == 4
    report = json.loads((tmp_path / "out" / "pack-report.json").read_text())["skipped"]
    assert {item["path"] for item in report} == set(expected_skips)
    for item in report:
        assert expected_skips[item["path"]] in item["reason"]

    with h5py.File(tmp_path / "out" / manifest.shards[0].path) as shard:
        images, labels = shard["images"][...], shard["labels"][...]
    assert images.shape == (6, 16, 16, 3) and set(labels) == {0}
    # Sorted order within "good": cmyk, gray, palette, rgb, rgba, rotated.
    by_name = dict(zip(["cmyk", "gray", "palette", "rgb", "rgba", "rotated"], images, strict=True))
    assert by_name["cmyk"][8, 8].tolist()[0] > 200 and by_name["cmyk"][8, 8].tolist()[2] < 60
    assert abs(int(by_name["gray"][8, 8, 0]) - 128) <= 2 and len(set(by_name["gray"][8, 8].tolist())) == 1
    assert by_name["palette"][8, 8].tolist() == [0, 255, 0]
    assert by_name["rgba"][8, 8].tolist()[2] > 240
    rotated = by_name["rotated"].astype(int)
    assert rotated[1, 8, 0] > 200 and rotated[1, 8, 2] < 60  # red on top after the EXIF rotation
    assert rotated[14, 8, 2] > 200 and rotated[14, 8, 0] < 60


def test_encoded_layout_keeps_plain_jpegs_and_normalises_the_rest(tmp_path: Path) -> None:
    write_awkward_corpus(tmp_path / "src")
    manifest = pack(tmp_path / "src", tmp_path / "out", PackOptions(layout="encoded", workers=1, shuffle_seed=None,
                                                                    progress=False)).manifest
    with h5py.File(tmp_path / "out" / manifest.shards[0].path) as shard:
        data, offsets = shard["data"][...], shard["offsets"][...]
    samples = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
    assert samples[3] == (tmp_path / "src" / "good" / "rgb.jpg").read_bytes()
    import io

    for sample in samples:
        with Image.open(io.BytesIO(sample)) as image:
            assert image.mode == "RGB"
    with Image.open(io.BytesIO(samples[5])) as upright:
        assert upright.size == (40, 80)


def test_strict_makes_bad_files_fatal_and_leaves_nothing_behind(tmp_path: Path) -> None:
    write_corpus(tmp_path / "src" / "a", per_class=3)
    (tmp_path / "src" / "zz").mkdir()
    (tmp_path / "src" / "zz" / "broken.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(DataToolError, match="broken.jpg"):
        pack(tmp_path / "src", tmp_path / "out", PackOptions(image_size=16, shard_bytes=1000, strict=True,
                                                             workers=1, progress=False))
    assert list((tmp_path / "out").iterdir()) == []


def test_killed_pack_leaves_no_file_that_looks_complete(tmp_path: Path) -> None:
    write_corpus(tmp_path / "src", per_class=150)
    out = tmp_path / "out"
    kill_pack_mid_shards(tmp_path / "src", out)  # killed at its first temporary shard
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("shard-*.h5"))
    assert list(out.glob(".shard-*"))  # only hidden temporaries remain
    pack(tmp_path / "src", out, PackOptions(image_size=48, shard_bytes=7 * 1024, workers=2, progress=False))
    assert not list(out.glob(".shard-*"))
    assert verify(out).num_samples == 300


def test_verify_names_the_failing_shard(tmp_path: Path, packed: Path, capsys: pytest.CaptureFixture) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in packed.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert main(["verify", str(copy)]) == 0
    manifest = load_manifest(copy)
    victim = copy / manifest.shards[1].path
    payload = bytearray(victim.read_bytes())
    payload[len(payload) // 2] ^= 1
    victim.write_bytes(bytes(payload))
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and manifest.shards[1].path in err and "sha256" in err
    assert "\n" not in err
    victim.unlink()
    assert main(["verify", str(copy)]) == 1
    assert "missing" in capsys.readouterr().err


def test_labels_follow_class_folders(packed: Path) -> None:
    manifest = load_manifest(packed)
    labels = np.concatenate([h5py.File(packed / s.path)["labels"][...] for s in manifest.shards])
    assert labels.tolist() == [0] * 12 + [1] * 12
    assert [s.first_index for s in manifest.shards] == list(np.cumsum([0] + [s.num_samples
                                                                            for s in manifest.shards])[:-1])


@pytest.mark.parametrize(("argv", "where"), [
    (["pack", "/nonexistent/src", "OUT"], "/nonexistent/src"),
    (["pack", "SRC", "OUT", "--shard-size", "lots"], "--shard-size"),
    (["pack", "SRC", "OUT", "--layout", "png"], "--layout"),
    (["verify", "/nonexistent/out"], "/nonexistent/out/manifest.json"),
    (["stage", "bucket/prefix", "DEST"], "bucket/prefix"),
])
def test_cli_errors_are_one_line(argv: list[str], where: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and where in err and "Traceback" not in err


def test_pack_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=2)
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--size", "8", "--no-progress"]) == 0
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--size", "8", "--no-progress"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--size", "8", "--no-progress",
                 "--force"]) == 0
