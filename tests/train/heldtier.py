"""A remote checkpoint tier whose copies the test holds: a slow upload, or a store that stopped answering, as a state
the test controls instead of a race (tests/train/test_checkpoint_busy.py, test_checkpoint_deadline.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from workloads.train.tiers import DirectoryTier


class HeldTier(DirectoryTier):
    """A directory tier whose copy of each file waits until `release` is set; `copying` is set once a copy began."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.copying = threading.Event()

    def put(self, local: Path, step: int, name: str) -> None:
        self.copying.set()
        assert self.release.wait(60), "the test never released the copy"
        super().put(local, step, name)
