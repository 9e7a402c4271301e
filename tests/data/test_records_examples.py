"""examples/train_clip.py (image + caption) and examples/train_tiny_lm.py (tokens) on CPU, on data packed by
pack-captions and pack-tokens: every sample each epoch, and the loss falls on data with something to learn; a SIGTERM
stops each after the step in flight with a checkpoint and exit 43, and the rerun resumes there."""

from __future__ import annotations

import io
import json
import os
import runpy
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workloads.data.writing.captions import pack_captions
from workloads.data.writing.records_pack import RecordPackOptions
from workloads.data.writing.tokens import pack_tokens
from workloads.jobspec.fields import DISRUPTION_EXIT_CODE

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
    return [json.loads(line) for line in stdout.splitlines() if '"epoch"' in line and '"event"' not in line]


def packed_pairs(tmp_path: Path) -> Path:
    """32 image + caption pairs (4 colours, a caption naming each), packed by pack-captions."""
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
    return out


def packed_tokens(tmp_path: Path) -> tuple[Path, int]:
    """16 counting documents packed by pack-tokens into sequences of 17; the directory and the sequence count."""
    src = tmp_path / "corpus"
    src.mkdir()
    rng = np.random.default_rng(1)
    for doc in range(16):  # counting documents: the next id is the last one plus one, which a model can learn
        start = int(rng.integers(1, 40))
        np.save(src / f"doc{doc:02d}.npy", (np.arange(start, start + 30) % 60 + 1).astype(np.int32))
    out = tmp_path / "packed"
    result = pack_tokens(src, out, RecordPackOptions(shard_bytes=1 << 10, progress=False), seq_len=17, eos=0)
    return out, result.report["sequences"]


CLIP_ARGS = ["--batch-size", "8", "--image-size", "16", "--workers", "0"]
TINY_LM_ARGS = ["--vocab-size", "64", "--dim", "32", "--layers", "1", "--batch-size", "8", "--workers", "0"]


def test_clip_example_on_image_caption_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = packed_pairs(tmp_path)
    epochs = run_example("train_clip.py", ["--data", str(out), "--epochs", "3", *CLIP_ARGS], capsys, monkeypatch)
    assert [(line["epoch"], line["samples"]) for line in epochs] == [(epoch, 32) for epoch in range(3)]
    assert epochs[-1]["loss"] < epochs[0]["loss"]


def test_tiny_lm_example_on_token_sequences(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out, sequences = packed_tokens(tmp_path)
    assert sequences == 16 * 31 // 17
    epochs = run_example("train_tiny_lm.py", ["--data", str(out), "--epochs", "3", *TINY_LM_ARGS], capsys,
                         monkeypatch)
    assert [(line["epoch"], line["sequences"]) for line in epochs] == [(epoch, sequences) for epoch in range(3)]
    assert epochs[-1]["loss"] < epochs[0]["loss"]


@pytest.mark.parametrize("name", ["train_clip.py", "train_tiny_lm.py"])
def test_sigterm_stops_the_example_after_a_step_with_a_checkpoint_and_the_rerun_resumes_there(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during the third step (as a drain sends it to PID 1): the example stops after that step through
    StopSignal, writes its checkpoint and exits 43; the rerun trains the rest of epoch 0, then epoch 1."""
    from workloads.train.stop import StopSignal

    if name == "train_clip.py":
        data, args, total, key = packed_pairs(tmp_path), CLIP_ARGS, 32, "samples"
    else:
        (data, total), args, key = packed_tokens(tmp_path), TINY_LM_ARGS, "sequences"
    command = ["--data", str(data), "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ckpt"), *args]
    check, calls = StopSignal.check, []

    def signalled_at_the_third(self: StopSignal, checkpoint: object = None) -> None:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler sets the flag; this check is the agreed step
        check(self, checkpoint)  # type: ignore[arg-type]

    monkeypatch.setattr(StopSignal, "check", signalled_at_the_third)
    with pytest.raises(SystemExit) as stopped:
        run_example(name, command, capsys, monkeypatch)
    assert stopped.value.code == DISRUPTION_EXIT_CODE and len(calls) == 3
    saved = torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 3  # the step the signal arrived in, saved before leaving

    monkeypatch.setattr(StopSignal, "check", check)
    epochs = run_example(name, command, capsys, monkeypatch)
    assert [(line["epoch"], line[key]) for line in epochs] == [(0, total - 3 * 8), (1, total)]
    steps_per_epoch = -(-total // 8)
    assert torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=True)["step"] == 2 * steps_per_epoch
