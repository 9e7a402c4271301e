"""A full disk while the evidence bundle is written: the run stops like a failed step (destroy still runs once up
began), every command's output is still read to its end, nothing is half-written (summary.json is the last one
written whole), the CLI prints one line naming the file and exits 2, and an earlier bundle is untouched.

The fast cases get a real ENOSPC from the kernel through /dev/full; the end-to-end case fills a real 256 KiB tmpfs
mounted in a private mount namespace (`unshare -rm`), skipped where this kernel does not allow that."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TextIO

import pytest

from infra.acceptance import runner
from infra.acceptance.bundle import SUMMARY, BundleWriteError, check_bundle, load_summary
from infra.acceptance.plan import Command, Step
from infra.acceptance.runner import Run, StepLog, run_command

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


def _steps() -> list[Step]:
    return [Step("preflight", (Command(("preflight",)),), 60),
            Step("up", (Command(("pulumi", "up")),), 60),
            Step("verify", (Command(("verify",)),), 60),
            Step("destroy", (Command(("pulumi", "destroy")),), 60, after_up=True)]


class FullAt(StepLog):
    """The log of one step lands on /dev/full: every write to it fails with the kernel's ENOSPC."""

    def __init__(self, path: Path):
        super().__init__(FULL if path.name == "02-up.log" else path)
        self.path = path


@needs_dev_full
def test_a_log_on_a_full_disk_stops_the_run_but_destroy_still_runs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "StepLog", FullAt)
    calls: list[str] = []

    def execute(argv: tuple[str, ...], log: TextIO, deadline_s: float) -> tuple[int, str]:
        calls.append(" ".join(argv))
        log.write("x" * 100_000 + "\n")
        return 0, "done\n"

    with pytest.raises(BundleWriteError) as raised:
        Run(_steps(), tmp_path, "dev", COMMIT, False, False, execute=execute)()
    assert (raised.value.where, raised.value.why) == (str(tmp_path / "02-up.log"), "No space left on device")
    assert calls == ["preflight", "pulumi up", "pulumi destroy"]  # verify not started; destroy ran
    summary = load_summary(tmp_path)  # (02-up.log went to /dev/full: not in the folder, so no check_bundle)
    assert summary.result == "failed" and summary.failed_step is None
    assert summary.bundle_error == f"{tmp_path / '02-up.log'}: No space left on device"
    assert [step.status for step in summary.steps] == ["passed", "passed", "not-run", "passed"]
    assert summary.steps[1].note == "02-up.log: No space left on device: the log is incomplete"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@needs_dev_full
def test_a_command_whose_log_fills_the_disk_is_still_read_to_its_end() -> None:
    """A megabyte through the pipe while every log write fails: nothing stalls, and the output is all returned."""
    log = StepLog(FULL)
    code, output = run_command([sys.executable, "-c", "import sys\nfor i in range(16384): print('y' * 63)"],
                               log, 20)
    log.close()
    assert code == 0 and output == ("y" * 63 + "\n") * 16384
    assert log.error is not None and log.error.filename == str(FULL)


def test_a_failing_log_that_is_not_a_steplog_does_not_stall_the_pump() -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    code, output = run_command([sys.executable, "-c", "print('a'); print('b')"], Broken(), 20)
    assert (code, output) == (0, "a\nb\n")


def _tmpfs_possible() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    done = subprocess.run([unshare, "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                          capture_output=True, timeout=20, check=False)
    return done.returncode == 0


# Runs inside the private mount namespace: a good run first (the earlier bundle), then a run whose `up` prints more
# than the disk holds; the CLI's own error handling prints the line.
SCRIPT = textwrap.dedent("""
    import hashlib, importlib.util, json, sys, types
    from pathlib import Path
    root, disk = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("acceptance_cli", root / "scripts" / "acceptance.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    from infra.acceptance.plan import Command, Step
    py = sys.executable
    say = lambda text: Command((py, "-c", f"print({text})"))
    cfg = types.SimpleNamespace(region="us-west-2")
    commit = "0123456789abcdef0123456789abcdef01234567"
    ok = [Step("preflight", (say("'ok'"),), 60)]
    assert cli.run("dev", cfg, ok, {"allreduce-job.yaml": "name: a\\n"}, disk / "evidence" / "dev-old", commit,
                   False, False, disk / "evidence", None) == 0
    old = sorted((disk / "evidence" / "dev-old").iterdir())
    print("old:", hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in old)).hexdigest(), flush=True)
    big = [Step("preflight", (say("'ok'"),), 60), Step("up", (say("'u' * 400_000"),), 60),
           Step("verify", (say("'v'"),), 60), Step("destroy", (say("'destroyed'"),), 60, after_up=True)]
    cli.main = lambda argv: cli.run("dev", cfg, big, {"allreduce-job.yaml": "name: a\\n"},
                                    disk / "evidence" / "dev-new", commit, False, False, disk / "evidence", None)
    sys.exit(cli.entry([]))
""")


@pytest.mark.slow  # a fresh interpreter imports pydantic and the kit: about 2 s (the /dev/full cases above are fast)
def test_a_real_full_disk_is_one_line_exit_2_and_the_earlier_bundle_is_intact(tmp_path: Path) -> None:
    if not _tmpfs_possible():
        pytest.skip("unshare -rm cannot mount a tmpfs here")
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "run.py").write_text(SCRIPT)
    # the earlier bundle is copied out before the namespace (and its tmpfs) goes away
    command = (f"mount -t tmpfs -o size=256k none {disk} && {sys.executable} {tmp_path / 'run.py'} {ROOT} {disk}; "
               f"code=$?; cp -a {disk}/evidence {tmp_path}/copied; exit $code")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 2, done.stderr
    new = disk / "evidence" / "dev-new"
    assert done.stderr.splitlines() == [f"error: {new / '02-up.log'}: No space left on device: the evidence bundle "
                                        "is incomplete (its summary.json is the last one written whole)"]
    printed = done.stdout.splitlines()
    assert printed[-1].startswith("destroy: passed") and "verify" not in done.stdout
    copied = tmp_path / "copied"
    old = sorted((copied / "dev-old").iterdir())
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in old)).hexdigest()
    assert [line for line in printed if line.startswith("old: ")] == [f"old: {digest}"]  # as it was before
    assert check_bundle(copied / "dev-old").result == "passed"
    last = json.loads((copied / "dev-new" / SUMMARY).read_text())  # whole: it parses and validates
    assert load_summary(copied / "dev-new").result == last["result"]
    assert not [p for p in (copied / "dev-new").iterdir() if p.name.endswith(".tmp")]
