"""examples/train_clip.py (image + caption) and examples/train_tiny_lm.py (tokens) on CPU, on data packed by
pack-captions and pack-tokens: every sample each epoch, and the loss falls on data with something to learn."""

from __future__ import annotations

import io
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workloads.data.writing.captions import pack_captions
from workloads.data.writing.records_pack import RecordPackOptions
from workloads.data.writing.tokens import pack_tokens

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


def run_example(name: str, args: list[str], capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> list[dict[str, float]]:
    """Run the script as `python examples/NAME ARGS` would, in this process (a subprocess spends most of its time
    importing torch), and return its epoch lines."""
    monkeypatch.setenv("ML_CLUSTER_SHM_BYTES", str(1 << 30))
    monkeypatch.setattr(sys, "argv", [name, *args])
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the models are tiny; the test machine's cores are shared
    try:
        runpy.run_path(str(ROOT / "examples" / name), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    print(stdout)
    return [json.loads(line) for line in stdout.splitlines() if '"epoch"' in line]


def test_clip_example_on_image_caption_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "pairs"
    (src / "img").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for index in range(32):
        colour = list(COLOURS)[index % len(COLOURS)]
        pixels = np.clip(np.asarray(COLOURS[colour]) + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        (src / "img" / f"{index}.jpg").write_bytes(buffer.getvalue())
        rows.append(json.dumps({"key": f"img/{index}.jpg", "caption": f"a {colour} photo"}))
    (src / "pairs.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "packed"
    pack_captions(src / "pairs.jsonl", out, RecordPackOptions(shard_bytes=8 << 10, workers=1, progress=False))
    epochs = run_example("train_clip.py", ["--data", str(out), "--epochs", "3", "--batch-size", "8",
                                           "--image-size", "16", "--workers", "0"], capsys, monkeypatch)
    assert [(line["epoch"], line["samples"]) for line in epochs] == [(epoch, 32) for epoch in range(3)]
    assert epochs[-1]["loss"] < epochs[0]["loss"]


def test_tiny_lm_example_on_token_sequences(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "corpus"
    src.mkdir()
    rng = np.random.default_rng(1)
    for doc in range(16):  # counting documents: the next id is the last one plus one, which a model can learn
        start = int(rng.integers(1, 40))
        np.save(src / f"doc{doc:02d}.npy", (np.arange(start, start + 30) % 60 + 1).astype(np.int32))
    out = tmp_path / "packed"
    result = pack_tokens(src, out, RecordPackOptions(shard_bytes=1 << 10, progress=False), seq_len=17, eos=0)
    sequences = result.report["sequences"]
    assert sequences == 16 * 31 // 17
    epochs = run_example("train_tiny_lm.py", ["--data", str(out), "--vocab-size", "64", "--dim", "32", "--layers",
                                              "1", "--epochs", "3", "--batch-size", "8", "--workers", "0"], capsys,
                         monkeypatch)
    assert [(line["epoch"], line["sequences"]) for line in epochs] == [(epoch, sequences) for epoch in range(3)]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
