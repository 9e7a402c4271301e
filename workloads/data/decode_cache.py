"""Decoded samples of encoded shards, kept on the node so each JPEG is decoded once, not once per epoch.

What a DataLoader worker makes of an encoded sample (decode, centre square, resize) depends only on the stored
bytes, the image size, the draft flag and the decoder, so it can be kept: every augmentation happens later, per
batch, on the device. The first epoch decodes and keeps each sample; later epochs read the pixels back (as fast as
the decoded layout), while what crosses the network stays the smaller JPEG bytes.

One file per shard, `<shard sha256>-<size>px-<draft|full>-<decoder>-<boot id>.rows` in the cache directory:
num_samples flag bytes, then num_samples rows of size x size x 3 uint8. Every process on the node (the workers of
every rank) shares the files through plain pread/pwrite: a row is written first and its flag after it, and a row is
only read after its flag was read as set, so the kernel's page cache orders them for every reader. A writer killed
mid-row leaves its flag unset (the sample is decoded again). The boot id in the name means a file written before a
crash or power loss, when the page cache may have reached the disk out of order, is never trusted; such files, and
those of other datasets or settings, are removed when a cache is opened for a dataset.

The budget bounds the files' total size: a shard gets a file only while the files fit, first come first served, and
nothing is evicted (the shards decoded first stay). A full file system stops writes for the process that hit it;
what is there is still read.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SUFFIX = ".rows"


def boot_id() -> str:
    """This boot's id (Linux); a file kept across a reboot must not be trusted. Elsewhere: the process's own."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:16]
    except OSError:
        return f"pid{os.getpid()}"


@dataclass(frozen=True)
class DecodeKey:
    """What the decoded pixels depend on, beyond the shard's bytes."""

    image_size: int
    draft: bool
    decoder: str  # "simplejpeg" or "pil": their pixels may differ slightly
    boot: str = field(default_factory=boot_id)

    def file_name(self, shard_sha256: str) -> str:
        mode = "draft" if self.draft else "full"
        return f"{shard_sha256}-{self.image_size}px-{mode}-{self.decoder}-{self.boot}{SUFFIX}"


class ShardRows:
    """One shard's decoded rows in a cache file (see the module docstring for the layout and the ordering)."""

    def __init__(self, fd: int, num_samples: int, row_bytes: int) -> None:
        self.fd = fd
        self.num_samples = num_samples
        self.row_bytes = row_bytes

    def _row_offset(self, local: int) -> int:
        return self.num_samples + local * self.row_bytes

    def read(self, local: int, out: np.ndarray) -> list[int]:
        """Fill out[k] (C-contiguous rows) with sample local + k wherever it was kept: one read of the flags, one of
        each run of kept rows. Returns the k that were not kept."""
        flags = os.pread(self.fd, len(out), local).ljust(len(out), b"\0")  # a short file: the rest was not kept
        missing = [k for k in range(len(out)) if flags[k] != 1]
        kept_from = 0
        for stop in [*missing, len(out)]:
            if stop > kept_from:  # rows kept_from..stop-1 are kept: one read
                view = out[kept_from:stop].data.cast("B")
                if os.preadv(self.fd, [view], self._row_offset(local + kept_from)) != len(view):
                    return list(range(len(out)))  # truncated behind our back: decode them all
            kept_from = stop + 1
        return missing

    def write(self, local: int, pixels: np.ndarray) -> None:
        """Keep sample `local`: the row, then its flag. OSError (e.g. ENOSPC) leaves the flag unset."""
        row = np.ascontiguousarray(pixels).data.cast("B")
        if os.pwrite(self.fd, row, self._row_offset(local)) != self.row_bytes:
            raise OSError(errno.ENOSPC, "short write to the decode cache")
        os.pwrite(self.fd, b"\x01", local)

    def close(self) -> None:
        os.close(self.fd)


class DecodeCache:
    """The node's decoded rows of one dataset's encoded shards under `directory`, at most `budget_bytes` in all.

    Picklable (DataLoader workers get a copy); each process opens its own descriptors.
    """

    def __init__(self, directory: str | os.PathLike[str], budget_bytes: int, key: DecodeKey) -> None:
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self.key = key
        self.row_bytes = key.image_size * key.image_size * 3
        self.writable = True  # cleared in a process whose write failed (a full file system)

    def file_bytes(self, num_samples: int) -> int:
        return num_samples * (1 + self.row_bytes)

    def prepare(self, shard_sha256s: list[str]) -> None:
        """Create the directory and remove cache files that are not this dataset's under this key (other
        datasets, other settings, an earlier boot). Run once per rank before the workers start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        keep = {self.key.file_name(sha) for sha in shard_sha256s}
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and entry.name not in keep and entry.is_file(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)

    def _used_bytes(self) -> int:
        total = 0
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

    def open_shard(self, shard_sha256: str, num_samples: int) -> ShardRows | None:
        """The shard's rows, creating its file if the budget allows; None when it does not (read and decode)."""
        path = self.directory / self.key.file_name(shard_sha256)
        size = self.file_bytes(num_samples)
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)  # rows go into this file, never where a link points
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not self.writable or self._used_bytes() + size > self.budget_bytes:
                return None
            fd = os.open(path, flags | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size < size:
            # Sparse: blocks are allocated as rows land. Two processes creating it at once both extend to the
            # same size, which changes nothing already written.
            os.ftruncate(fd, size)
        return ShardRows(fd, num_samples, self.row_bytes)
