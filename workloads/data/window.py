"""Both sides of the rolling-window protocol between `stage --window` and the training reader.

The stager keeps at most a fixed number of bytes of shards in DEST, fetching ahead in read order and deleting
shards once the reader says it is done with them. The two sides agree through two small JSON files in
DEST/.window/ (see workloads/data/format.py), each written by exactly one side with an atomic rename:

    stager.json  {"order": [...], "ready": [...], "done": bool, "error": str | null}   written by the stager
    reader.json  {"consumed": [...]}                                                  written by the reader

Shard names are manifest paths ("shard-00000.h5"), relative to DEST. A shard appears in "ready" only after it has
been downloaded, verified against the manifest's sha256 and renamed into place. "error" (optional, an addition to
the format contract) carries the stager's one-line failure so a waiting reader fails fast instead of timing out.

Reader API (used by the HDF5 Dataset; one WindowReader per process is fine, state lives on disk):

    reader = WindowReader(dest)
    path = reader.wait_ready("shard-00003.h5", timeout=600)   # -> Path to the verified local file
    ... open path, read the samples ...
    reader.mark_consumed("shard-00003.h5")                    # the stager may now delete it

If DEST has no window state at all (plain copy mode, or a dataset on local disk), `wait_ready` returns as soon as
the file exists. Deleting a consumed shard is safe even while a reader still holds it open (POSIX unlink).
Several processes (DataLoader workers) may call `mark_consumed`: updates are merged under an advisory lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workloads.data.format import READER_STATE, STAGER_STATE, WINDOW_DIR, atomic_write_bytes


class WindowStagerError(RuntimeError):
    """The stager reported a failure; the shard will never become ready."""


@dataclass(frozen=True)
class StagerState:
    order: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None


def window_dir(dest: str | os.PathLike[str]) -> Path:
    return Path(dest) / WINDOW_DIR


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError, RecursionError) as exc:  # bad JSON or UTF-8, a directory, nested too deep
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
        raise ValueError(f"{path}: unreadable window state: {why or type(exc).__name__}") from exc


def _write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, sort_keys=True) + "\n").encode())


def read_stager_state(dest: str | os.PathLike[str]) -> StagerState | None:
    raw = _read_json(window_dir(dest) / STAGER_STATE)
    if raw is None:
        return None
    return StagerState(order=list(raw.get("order", [])), ready=list(raw.get("ready", [])),
                       done=bool(raw.get("done", False)), error=raw.get("error"))


def write_stager_state(dest: str | os.PathLike[str], state: StagerState) -> None:
    _write_json(window_dir(dest) / STAGER_STATE, {"order": state.order, "ready": state.ready,
                                                  "done": state.done, "error": state.error})


def read_consumed(dest: str | os.PathLike[str]) -> set[str]:
    raw = _read_json(window_dir(dest) / READER_STATE)
    consumed = raw.get("consumed", []) if isinstance(raw, dict) else []
    return {name for name in consumed if isinstance(name, str)} if isinstance(consumed, list) else set()


class WindowReader:
    """The reader's side: wait for a shard to be staged, then say when it has been consumed."""

    def __init__(self, dest: str | os.PathLike[str], poll_interval_s: float = 0.01) -> None:
        self.dest = Path(dest)
        self.poll_interval_s = poll_interval_s

    def _name(self, shard: str | os.PathLike[str]) -> str:
        path = Path(shard)
        if not path.is_absolute():
            return path.as_posix()
        for base in (self.dest.absolute(), self.dest.resolve()):
            if path.is_relative_to(base):
                return path.relative_to(base).as_posix()
        raise ValueError(f"{shard}: not inside the staging directory {self.dest}")

    def order(self) -> list[str] | None:
        """The read order the stager follows, or None when DEST has no window state."""
        state = read_stager_state(self.dest)
        return state.order if state else None

    def is_ready(self, shard: str | os.PathLike[str]) -> bool:
        name = self._name(shard)
        state = read_stager_state(self.dest)
        if state is None:
            return (self.dest / name).is_file()
        if state.error:
            raise WindowStagerError(f"{self.dest}: stager failed: {state.error}")
        if state.order and name not in state.order:
            raise ValueError(f"{name}: not in the stager's order for {self.dest}")
        if name not in state.ready:
            return False
        if (self.dest / name).is_file():
            return True
        if name in read_consumed(self.dest):
            raise ValueError(f"{self.dest / name}: consumed and deleted already (a rolling window is read once)")
        return False

    def wait_ready(self, shard: str | os.PathLike[str], timeout: float | None = None) -> Path:
        """Block until the shard is staged and verified; return its local path.

        Raises TimeoutError after `timeout` seconds (None waits forever) and WindowStagerError when the stager
        reported a failure.
        """
        name = self._name(shard)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_ready(name):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.dest / name}: not staged after {timeout:g}s")
            time.sleep(self.poll_interval_s)
        return self.dest / name

    def mark_consumed(self, shard: str | os.PathLike[str] | Iterable[str]) -> None:
        """Tell the stager that this reader is finished with the shard(s); merges with other processes' marks."""
        names = [self._name(shard)] if isinstance(shard, str | os.PathLike) else [self._name(s) for s in shard]
        directory = window_dir(self.dest)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".reader.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            consumed = read_consumed(self.dest) | set(names)
            _write_json(directory / READER_STATE, {"consumed": sorted(consumed)})
