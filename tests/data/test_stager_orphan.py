"""A stager ends with the reader that started it: before, a cache-mode stager whose training script died (SIGKILL,
OOM) served nobody for hours (its waits for the reader's plan have no deadline by default). PackedData and MixedData
start it with --reader-pid (stager_process.start_stager); the stager stops within PARENT_POLL_S of the reader's
end and exits at the latest READER_GONE_GRACE_S later (held here to: it ends, and says the reader's end stopped
it; the seconds it took are printed, not asserted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.data.helpers import alive
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload
from workloads.parentwatch import parent_gone, watch_parent

REPO = Path(__file__).resolve().parents[2]


def test_the_watch_calls_back_when_the_parent_is_gone() -> None:
    """The cheap sibling: a pid that is not this process's parent is a parent that is gone."""
    called = []
    assert not parent_gone(os.getppid())
    watch_parent(os.getppid() + 100_000, lambda: called.append(time.monotonic()), interval_s=0.01).join(timeout=5)
    assert len(called) == 1
    thread = watch_parent(os.getppid(), lambda: called.append(0.0), interval_s=0.01)
    time.sleep(0.05)
    assert thread.is_alive() and len(called) == 1  # the parent is here: it keeps watching


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_a_cache_stager_ends_when_its_reader_is_killed(tmp_path: Path, packed: Path, s3_url: str,
                                                       bucket: str) -> None:
    upload(make_client(s3_url, 4), packed, S3Uri(bucket, "one"), UploadOptions(workers=2, progress=False))
    reader = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from workloads.data.stager_process import start_stager
        stager = start_stager("s3://{bucket}/one", Path({str(tmp_path / 'dest')!r}), {s3_url!r}, 1 << 20, 2)
        print(stager.process.pid, stager.log, flush=True)
        time.sleep(600)
    """)
    process = subprocess.Popen([sys.executable, "-c", reader], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    stager = 0
    try:
        assert process.stdout is not None
        pid, log = process.stdout.readline().split()
        stager = int(pid)
        deadline = time.monotonic() + 60
        while not (tmp_path / "dest" / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "dest" / "manifest.json").exists(), Path(log).read_text()
        time.sleep(1.0)
        assert alive(stager), Path(log).read_text()  # serving: it waits for the reader's plan, without a deadline
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed = time.monotonic()
        # a hang guard, not a timing check (load moves it): the log line below says the reader's end stopped it
        while alive(stager) and time.monotonic() - killed < 60:
            time.sleep(0.05)
        ended = time.monotonic() - killed
        assert not alive(stager), f"the stager outlived its reader by {ended:.1f}s"
        text = Path(log).read_text()
        assert f"stage: the reader (pid {process.pid}) is gone; stopping" in text, text
        assert not list((tmp_path / "dest").rglob("*.partial")), "a partial fetch was left behind"
        print(f"stager ended {ended:.2f}s after its reader was killed")
    finally:
        if process.poll() is None:
            process.kill()
        if stager and alive(stager):
            os.kill(stager, signal.SIGKILL)
