"""Issue 11, the trainer half: every way a run can be handed bad input, bad bytes or a bad environment, each
against real files and real subprocesses. Each case fails fast, with one line on stderr and a documented exit
code, or works exactly; JSON lines on stdout always parse."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import resource
import select
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.train.legacy import legacy_state, write_last_pt
from tests.train.test_train import REPO, TINY_RUN, _env, _events, _train, _train_here
from workloads.data.format.manifest import load_manifest, write_manifest
from workloads.train.__main__ import main, parse_args
from workloads.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
from workloads.train.checkpointer import latest_checkpoint

CODE = 42  # what the rendered Jobs set as CONFIG_ERROR_EXIT_CODE (workloads/jobspec)


def _strict_json(line: str) -> dict:
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def _run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
         preexec_fn=None) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    return subprocess.run(
        [sys.executable, "-m", "workloads.train", *TINY_RUN, *args],
        capture_output=True, text=True, env=env or _env(CONFIG_ERROR_EXIT_CODE=str(CODE)), cwd=REPO,
        timeout=timeout, preexec_fn=preexec_fn,
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """stderr is exactly one `error: ...` line (no traceback); returns it."""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


def _lines(result: subprocess.CompletedProcess[str]) -> list[dict]:
    return [_strict_json(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def finished(tiny_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory holding the end of a 1-epoch run on the decoded dataset (width 8)."""
    directory = tmp_path_factory.mktemp("finished")
    _train_here(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0",
                 "--checkpoint-dir", str(directory)])
    return directory


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _resume(data: Path, directory: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--epochs", "2", "--workers", "0", "--checkpoint-dir", str(directory),
            "--resume", *extra]


def _main_code(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", str(CODE))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main([*TINY_RUN, *args])
    except SystemExit as exited:
        return int(exited.code or 0)
    finally:
        torch.set_num_threads(threads)


def _refused(data: Path, directory: Path, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> str:
    """Resuming from DIRECTORY is a config error (exit CODE); what the trainer wrote to stderr."""
    assert _main_code(_resume(data, directory), monkeypatch) == CODE
    return capsys.readouterr().err


# --- checkpoint integrity ------------------------------------------------------------------------------------
# The trainer's own checkpoints are sharded (workloads/train/sharded.py; their damage cases, one by one, are in
# test_sharded_checkpoint.py): a damaged one is skipped for the previous good one. An older trainer's last.pt is
# read while no sharded checkpoint is complete, and refused (a config error) when it does not verify.


@pytest.fixture(scope="module")
def legacy(finished: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run's end as an older trainer wrote it: last.pt and its sidecar, no sharded folder."""
    directory = tmp_path_factory.mktemp("legacy")
    write_last_pt(directory, legacy_state(finished))
    return directory


@pytest.fixture
def legacy_copy(legacy: Path, tmp_path: Path) -> Path:
    """A copy of `legacy` the test may change."""
    return _copy(legacy, tmp_path / "ckpt")


def _largest_member_middle(path: Path) -> int:
    """Byte offset in the middle of the largest tensor stored in a torch zip checkpoint."""
    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
        raw = path.read_bytes()
        header = member.header_offset
        name_len = int.from_bytes(raw[header + 26 : header + 28], "little")
        extra_len = int.from_bytes(raw[header + 28 : header + 30], "little")
        return header + 30 + name_len + extra_len + member.file_size // 2


def test_an_older_trainers_last_pt_resumes_once_and_the_next_save_is_sharded(
    legacy_copy: Path, finished: Path, tiny_data: dict[str, Path], tmp_path: Path
) -> None:
    lines = _train_here(_resume(tiny_data["decoded"], legacy_copy))
    assert _events(lines, "resumed")[0] == {"event": "resumed", "epoch": 1, "batch": 0, "step": 6}
    assert [e["epoch"] for e in _events(lines, "epoch")] == [1]
    saved = latest_checkpoint(legacy_copy)
    assert saved is not None and (saved["epoch"], saved["step"]) == (2, 12)
    # the same epoch trained from the sharded checkpoint of the same run gives the same weights
    again = _copy(finished, tmp_path / "sharded")
    _train_here(_resume(tiny_data["decoded"], again))
    expected = latest_checkpoint(again)
    assert expected is not None
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, saved["model"][name]), name
    # from now on the sharded checkpoint wins: last.pt (still there) is not read again
    (legacy_copy / CHECKPOINT_NAME).write_bytes(b"not read any more")
    lines = _train_here([*_resume(tiny_data["decoded"], legacy_copy)[:-1], "--resume"])
    assert _events(lines, "resumed")[0]["step"] == 12


def test_a_damaged_sharded_checkpoint_is_skipped_with_one_line(
    finished: Path, tiny_data: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The only checkpoint has an altered shard: the run says which file and starts fresh (exit 0); with an older
    last.pt beside it, that is the previous good checkpoint and the run resumes from it."""
    directory = _copy(finished, tmp_path / "ckpt")
    shard = sorted((directory / "step-000000006").glob("*.distcp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    shard.write_bytes(bytes(raw))
    lines = _train_here(_resume(tiny_data["decoded"], directory))
    err = capfd.readouterr().err
    assert f"checkpoint: step 6 skipped: {shard}: sha256" in err and "starting fresh" in err
    assert not _events(lines, "resumed") and [e["epoch"] for e in _events(lines, "epoch")] == [0, 1]


def test_a_damaged_last_pt_is_refused_not_silently_loaded(
    legacy_copy: Path, tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = legacy_copy / CHECKPOINT_NAME
    raw = bytearray(target.read_bytes())
    raw[_largest_member_middle(target)] ^= 0x40
    target.write_bytes(bytes(raw))
    torch.load(target, weights_only=True)  # the damage is invisible to torch: only a digest finds it
    err = _refused(tiny_data["decoded"], legacy_copy, monkeypatch, capsys).splitlines()
    assert err[-1].startswith("error: ") and "sha256" in err[-1]
    assert all(line.startswith("checkpoint: ") for line in err[:-1])  # what was searched, no traceback


def test_a_truncated_last_pt_is_refused(
    legacy_copy: Path, tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = legacy_copy / CHECKPOINT_NAME
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    err = _refused(tiny_data["decoded"], legacy_copy, monkeypatch, capsys).splitlines()
    assert err[-1].startswith("error: ") and CHECKPOINT_NAME in err[-1] and len(err) == 1


def test_a_last_pt_without_its_sha256_sidecar_is_refused_unless_allowed(
    legacy_copy: Path, tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (legacy_copy / f"{CHECKPOINT_NAME}.sha256").unlink()
    err = _refused(tiny_data["decoded"], legacy_copy, monkeypatch, capsys)
    assert "sha256" in err and "--allow-unverified-checkpoint" in err and err.count("\n") == 1
    lines = _train_here(_resume(tiny_data["decoded"], legacy_copy, "--allow-unverified-checkpoint"))
    assert _events(lines, "resumed")[0]["epoch"] == 1 and _events(lines, "done")


def test_disk_full_at_the_final_save_is_a_runtime_error_and_keeps_the_previous_checkpoint(
    finished: Path, tiny_data: dict[str, Path], tmp_path: Path
) -> None:
    """RLIMIT_FSIZE makes every write past 4 KiB fail (EFBIG, as ENOSPC would): the epoch-2 save fails in the
    background, so the run ends with one line and exit 1 (a retry resumes), and the epoch-1 checkpoint still
    verifies and loads."""
    directory = _copy(finished, tmp_path / "ckpt")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = _run(_resume(tiny_data["decoded"], directory), preexec_fn=limit)
    assert result.returncode == 1, result.stderr[-3000:]
    *said, error = result.stderr.splitlines()
    assert error.startswith("error: ") and "final checkpoint (step 12)" in error and "--resume" in error, error
    assert all(line.startswith("checkpoint: ") for line in said), said  # what was loaded and what failed
    assert any(line.startswith("checkpoint: step 12 not written") for line in said)
    state = latest_checkpoint(directory)
    assert state is not None and state["epoch"] == 1 and state["step"] == 6


# --- checkpoints from another run ------------------------------------------------------------------------------


def _rewrite(directory: Path, change) -> None:  # noqa: ANN001
    state = load_checkpoint(directory)
    assert state is not None
    change(state)
    write_last_pt(directory, state)


def test_a_mid_epoch_checkpoint_without_the_loader_position_is_refused(
    legacy_copy: Path, tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def older_trainer_mid_epoch(state: dict) -> None:
        state["epoch"], state["batch"] = 0, 2  # what a trainer that replayed by batch index wrote
        state.pop("loader", None)

    _rewrite(legacy_copy, older_trainer_mid_epoch)
    args = _resume(tiny_data["decoded"], legacy_copy)
    args[args.index("--epochs") + 1] = "1"
    assert _main_code(args, monkeypatch) == CODE
    err = capsys.readouterr().err.splitlines()[-1]
    assert "--resume" in err and "mid-epoch" in err and "older trainer" in err


@pytest.mark.parametrize(("change", "value"), [
    ("--seed", "5"),
    pytest.param("--shuffle-shards", "1", marks=pytest.mark.slow),
    pytest.param("--block-size", "4", marks=pytest.mark.slow),
])
def test_resume_mid_epoch_with_another_order_is_refused(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    change: str, value: str,
) -> None:
    directory = tmp_path / "ckpt"
    # killed after step 5: the save of step 4 may still be in flight, the one of step 2 is complete (with
    # --checkpoint-if-busy wait a periodic save waits for the one before): a mid-epoch checkpoint either way
    args = ["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0", "--checkpoint-dir", str(directory),
            "--checkpoint-every", "2", "--checkpoint-if-busy", "wait", "--stop-after-steps", "5"]
    _train(args, expect=-9)
    resumed = [*args[:-2], "--resume", change, value]
    assert _main_code(resumed, monkeypatch) == CODE
    *said, err = capsys.readouterr().err.splitlines()
    assert err.startswith(f"error: {change}: ") and "mid-epoch" in err
    assert len(said) == 1 and said[0].startswith("checkpoint: resumed from step ")  # loaded, then the order refused


@pytest.mark.slow  # two runs; test_resume_exact keeps mid-epoch exactness in make test
def test_resume_mid_epoch_with_another_batch_size_trains_exactly_the_rest(
    tiny_data: dict[str, Path], tmp_path: Path
) -> None:
    directory = tmp_path / "ckpt"
    common = ["--data", str(tiny_data["decoded"]), "--epochs", "2", "--workers", "0", "--checkpoint-dir",
              str(directory)]
    # --batch-size 8 (TINY_RUN): killed after step 5, the last complete checkpoint is after step 4 or, when that
    # save was still in flight, step 2 (32 or 16 of 42 samples; step 4's save waited for step 2's).
    _train([*common, "--checkpoint-every", "2", "--checkpoint-if-busy", "wait", "--stop-after-steps", "5"], expect=-9)
    saved = latest_checkpoint(directory)
    assert saved is not None and saved["step"] in (2, 4)
    done = 8 * saved["step"]
    lines = _train_here([*common, "--resume", "--batch-size", "6"])
    epochs = _events(lines, "epoch")
    assert [(e["epoch"], e["samples"]) for e in epochs] == [(0, 42 - done), (1, 42)]
    # 26 samples in batches of 6: 4 full ones and 2 left over; 10: one full one and 4 left over
    assert epochs[0]["batches"] == -(-(42 - done) // 6)


def test_resume_with_another_batch_size_at_an_epoch_boundary_is_exact(
    finished: Path, tiny_data: dict[str, Path], tmp_path: Path
) -> None:
    directory = _copy(finished, tmp_path / "ckpt")
    lines = _train_here([*_resume(tiny_data["decoded"], directory), "--batch-size", "16"])
    (epoch,) = _events(lines, "epoch")
    assert epoch["epoch"] == 1 and epoch["samples"] == 42 and epoch["batches"] == 3


def test_resume_with_another_width_is_a_config_error(
    finished: Path, tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: load_state_dict's RuntimeError, a traceback and exit 1, so the Job retried to its backoffLimit."""
    directory = _copy(finished, tmp_path / "ckpt")
    assert _main_code([*_resume(tiny_data["decoded"], directory), "--width", "16"], monkeypatch) == CODE
    err = capsys.readouterr().err
    assert err.startswith("error: --width: ") and err.count("\n") == 1


def test_resume_on_another_dataset_is_a_config_error(
    finished: Path, tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    other = _copy(tiny_data["folder"], tmp_path / "other")
    for number, entry in enumerate(sorted(other.iterdir())):
        entry.rename(other / f"kind{number}")  # same shape (3 classes, 42 images), other classes
    directory = _copy(finished, tmp_path / "ckpt")
    assert _main_code([*_resume(other, directory), "--image-size", "32"], monkeypatch) == CODE
    err = capsys.readouterr().err
    assert err.startswith("error: --data: ") and "another dataset" in err and err.count("\n") == 1
    shutil.rmtree(other / "kind2")  # 2 classes: the classifier's shape differs too
    assert _main_code([*_resume(other, directory), "--image-size", "32"], monkeypatch) == CODE
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("content", ["dict", "tensor"])
def test_a_valid_torch_file_with_other_content_is_refused(
    content: str, tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = {"hello": torch.ones(2)} if content == "dict" else torch.ones(3)
    target = tmp_path / CHECKPOINT_NAME
    torch.save(payload, target)  # a sound file with a right digest; its content is no checkpoint
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    (tmp_path / f"{CHECKPOINT_NAME}.sha256").write_text(f"{digest}  {CHECKPOINT_NAME}\n")
    err = _refused(tiny_data["decoded"], tmp_path, monkeypatch, capsys)
    assert "not a training checkpoint" in err and err.count("\n") == 1


def test_a_checkpoint_of_a_future_format_is_refused(
    legacy_copy: Path, tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _rewrite(legacy_copy, lambda state: state.update(format_version=99))
    err = _refused(tiny_data["decoded"], legacy_copy, monkeypatch, capsys)
    assert "format" in err and "99" in err and err.count("\n") == 1


def test_resume_of_a_finished_run_does_nothing_and_succeeds(finished: Path, tiny_data: dict[str, Path],
                                                              tmp_path: Path) -> None:
    directory = _copy(finished, tmp_path / "ckpt")
    args = _resume(tiny_data["decoded"], directory)
    args[args.index("--epochs") + 1] = "1"
    lines = _train_here(args)
    assert not _events(lines, "batch") and _events(lines, "done")[0]["steps"] == 6


# --- arguments ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [["--lr", "nan"], ["--lr", "inf"], ["--lr", "-0.1"], ["--lr", "0"], ["--wait-for-data", "nan"],
     ["--wait-for-data", "-1"], ["--epochs", "0"], ["--epochs", "-1"], ["--batch-size", "0"], ["--workers", "-1"],
     ["--checkpoint-every", "-2"], ["--width", "0"]],
)
def test_bad_numbers_are_refused_up_front(
    bad: list[str], tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main_code(["--data", str(tiny_data["decoded"]), "--workers", "0", "--epochs", "1", *bad],
                      monkeypatch) == CODE
    out, err = capsys.readouterr()
    assert '"event"' not in out and bad[0] in err and err.rstrip().splitlines()[-1].startswith("error: ")


def test_a_temp_dir_too_long_for_worker_sockets_is_refused_not_a_hang(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    long_tmp = tmp_path / ("t" * 90)
    long_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long_tmp))
    assert _main_code(["--data", str(tiny_data["decoded"]), "--workers", "2", "--epochs", "1"], monkeypatch) == CODE
    err = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert err.startswith("error: TMPDIR: ") and "--workers 0" in err


def test_a_diverging_loss_stops_with_an_error_and_valid_json(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: NaN losses trained to "done", exit 0, with `NaN` tokens in the JSON lines."""
    code = _main_code(["--data", str(tiny_data["decoded"]), "--epochs", "3", "--workers", "0", "--lr", "1e30",
                       "--checkpoint-dir", str(tmp_path)], monkeypatch)
    out, err = capsys.readouterr()
    assert code == CODE and err.startswith("error: loss: not finite") and err.count("\n") == 1, err
    lines = [_strict_json(line) for line in out.splitlines()]  # raises on NaN/Infinity tokens
    assert _events(lines, "batch") and not _events(lines, "done")
    state = latest_checkpoint(tmp_path)
    assert state is None or all(torch.isfinite(t).all() for t in state["model"].values())


def test_help_shows_every_option_and_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--stop-after-steps", "AWS_ENDPOINT_URL", "CHECKPOINT_URI", "CONFIG_ERROR_EXIT_CODE"):
        assert needle in text, needle


# --- data --------------------------------------------------------------------------------------------------------


def test_a_dataset_error_in_a_worker_is_the_same_one_line(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: with workers the error was the worker's whole traceback (DataLoader re-raises it as the message)."""
    data = _copy(tiny_data["decoded"], tmp_path / "data")
    shard = data / "shard-00001.h5"
    shard.write_bytes(b"not an hdf5 file")
    errors = []
    for workers in ("0", "2"):
        assert _main_code(["--data", str(data), "--epochs", "1", "--workers", workers, "--block-size", "4"],
                          monkeypatch) == CODE
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and errors[0].count("\n") == 1, errors
    assert errors[0].startswith(f"error: {shard}: ") and "Traceback" not in errors[1]


def test_a_manifest_with_fewer_classes_than_labels_is_a_dataset_error(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _copy(tiny_data["decoded"], tmp_path / "data")
    manifest = load_manifest(data)
    write_manifest(data, manifest.model_copy(update={"classes": manifest.classes[:2]}))
    assert _main_code(["--data", str(data), "--epochs", "1", "--workers", "2"], monkeypatch) == CODE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {data}: label 2 ") and err.count("\n") == 1


def test_an_empty_dataset_is_a_dataset_error(tiny_data: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "empty"
    data.mkdir()
    manifest = load_manifest(tiny_data["decoded"])
    write_manifest(data, manifest.model_copy(update={"num_samples": 0, "shards": []}))
    assert _main_code(["--data", str(data), "--workers", "0"], monkeypatch) == CODE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {data}") and "no samples" in err


def test_a_missing_dataset_directory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert _main_code(["--data", str(tmp_path / "nowhere")], monkeypatch) == CODE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'nowhere'}: ") and err.count("\n") == 1


# --- the checkpoint destination, checked before training ---------------------------------------------------------


@pytest.mark.parametrize("where", ["a-file", "/sys/ml-cluster-checkpoint-test"])  # sysfs refuses mkdir, even root
def test_an_unusable_checkpoint_dir_is_refused_before_training(
    where: str, tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: the run trained a whole epoch, then failed on the save with a traceback."""
    target = Path(where) if where.startswith("/") else tmp_path / where
    if not where.startswith("/"):
        target.write_text("x")
    assert _main_code(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0",
                       "--checkpoint-dir", str(target)], monkeypatch) == CODE
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --checkpoint-dir: {target}: ") and err.count("\n") == 1
    assert '"event": "batch"' not in out


# --- progress -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_progress_on_a_terminal_and_json_lines_on_stdout(tiny_data: dict[str, Path]) -> None:
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "workloads.train", *TINY_RUN, "--data", str(tiny_data["decoded"]), "--epochs", "1",
         "--workers", "0"],
        stdout=subprocess.PIPE, stderr=follower, env=_env(), cwd=REPO, text=True,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    out, _ = process.communicate(timeout=120)
    os.close(leader)
    assert process.returncode == 0
    terminal = b"".join(chunks).decode(errors="replace")
    assert "samples/s" in terminal and "loss" in terminal and "6/6" in terminal, terminal[-2000:]
    assert [_strict_json(line)["event"] for line in out.splitlines()][-1] == "done"


@pytest.mark.parametrize("value", ["0", "300", "-1", "abc", ""])
def test_a_config_error_exit_code_that_is_no_failure_code_falls_back_to_2(value: str,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """CONFIG_ERROR_EXIT_CODE=0 must not turn a config error into success, nor 300 into exit 44."""
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", value)
    with pytest.raises(SystemExit) as exited:
        parse_args(["--data", "/nowhere", "--metrics-port", "abc"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: argument --metrics-port: not a port number: 'abc'"
