"""Decoded samples of encoded shards, kept on the node so each JPEG is decoded once, not once per epoch.

What a DataLoader worker makes of an encoded sample (decode, centre square, resize) depends only on the stored
bytes, the image size, the draft flag and the decoder, so it can be kept: every augmentation happens later, per
batch, on the device. The first epoch decodes and keeps each sample; later epochs read the pixels back (as fast as
the decoded layout), while what crosses the network stays the smaller JPEG bytes.

One file per shard, `<shard sha256>-<size>px-<draft|full>-<decoder>-<boot id>-r3-<checksum>.rows` in the cache
directory:

    header   HEADER_BYTES: MAGIC, then the file's identity as JSON (shard sha256, size, draft, decoder, boot id,
             checksum, samples, row bytes), zero padded. A file is only used, and only ever removed, when its header
             says this code wrote it: the directory may hold the user's own files, or another Job's cache.
    table    num_samples entries of 8 bytes (page aligned): checksum of the row, then KEPT once the row is whole
    rows     num_samples rows of size x size x 3 uint8

Every process on the node (the workers of every rank) shares the files through plain pread/pwrite: a row is written
first and its entry after it, and a row is only used when its entry says KEPT and its checksum matches what was
read, so a writer killed mid-row, a row overwritten by anything else, or a torn read is decoded again, never trained
on. Every read is checked, in every epoch; what keeps that cheap is the checksum: CRC-32C in hardware (SSE4.2 /
ARMv8 instructions, through the `crc32c` package) checks a row right after it is read, while it is still in the CPU
cache, at a few microseconds a row, where zlib's crc32 cost as much as the read it protected (numbers and the other
options measured in docs/benchmarks.md). Without the package the check is zlib's crc32, in files of another name.
A new file appears whole (header written to a temp file, then linked to its name), so no reader sees a file without
its header. The boot id means a file written before a crash or power loss, when the page cache may have reached the
disk out of order, is never trusted; such files (with this code's header) are removed when a cache is prepared.
Files of other datasets or settings are left alone: two Jobs sharing a directory do not delete each other's cache.

The budget bounds this dataset's files under this key: a shard gets a file only while they fit, first come first
served, and nothing is evicted (the shards decoded first stay). A full file system stops writes for the process
that hit it; what is there is still read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SUFFIX = ".rows"
FORMAT = "r3"  # in the name too: files of earlier formats (no header; crc32 only) never carry this name
MAGIC = b"MLCLUSTER-DECODED-ROWS\x00\x03"
HEADER_BYTES = 4096
KEPT = 0x4B455054  # "KEPT": the entry's row is whole
_ENTRY = struct.Struct("<II")  # checksum of the row, KEPT
_PAGE = 4096
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def boot_id() -> str:
    """This boot's id (Linux); a file kept across a reboot must not be trusted. Elsewhere: the process's own."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:16]
    except OSError:
        return f"pid{os.getpid()}"


def _checksums() -> dict[str, Callable[[Any], int]]:
    """The row checksums this process can compute, by name: zlib's crc32 always, CRC-32C where the `crc32c` package
    (hardware instructions, a software table elsewhere) is installed."""
    known: dict[str, Callable[[Any], int]] = {"crc32": zlib.crc32}
    try:
        import crc32c
    except ImportError:
        return known
    known["crc32c"] = crc32c.crc32c
    return known


CHECKSUMS = _checksums()
DEFAULT_CHECKSUM = "crc32c" if "crc32c" in CHECKSUMS else "crc32"


@dataclass(frozen=True)
class DecodeKey:
    """What the decoded pixels depend on, beyond the shard's bytes."""

    image_size: int
    draft: bool
    decoder: str  # "simplejpeg" or "pil": their pixels may differ slightly
    boot: str = field(default_factory=boot_id)
    checksum: str = DEFAULT_CHECKSUM  # of each row: "crc32c" or "crc32" (processes of one Job agree)

    def __post_init__(self) -> None:
        if self.checksum not in CHECKSUMS:
            raise ValueError(f"decode cache checksum {self.checksum!r}: not one of {sorted(CHECKSUMS)}")

    def file_name(self, shard_sha256: str) -> str:
        mode = "draft" if self.draft else "full"
        return (f"{shard_sha256}-{self.image_size}px-{mode}-{self.decoder}-{self.boot}-{FORMAT}-{self.checksum}"
                f"{SUFFIX}")

    def identity(self, shard_sha256: str, num_samples: int) -> dict[str, Any]:
        return {"shard_sha256": shard_sha256, "image_size": self.image_size, "draft": self.draft,
                "decoder": self.decoder, "boot": self.boot, "checksum": self.checksum, "num_samples": num_samples,
                "row_bytes": self.image_size * self.image_size * 3}


def _header(identity: dict[str, Any]) -> bytes:
    body = MAGIC + json.dumps(identity, sort_keys=True).encode()
    if len(body) >= HEADER_BYTES:
        raise ValueError("decode cache header too long")
    return body.ljust(HEADER_BYTES, b"\0")


def read_identity(fd: int) -> dict[str, Any] | None:
    """The identity in a file's header, or None when the header is not this code's (the file is not ours)."""
    head = os.pread(fd, HEADER_BYTES, 0)
    if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
        return None
    try:
        identity = json.loads(head[len(MAGIC):].rstrip(b"\0").decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return identity if isinstance(identity, dict) else None


def _table_bytes(num_samples: int) -> int:
    return -(-num_samples * _ENTRY.size // _PAGE) * _PAGE


def bytes_needed(image_size: int, shard_sizes: Sequence[int]) -> int:
    """The budget that keeps every sample of shards of these sizes: per shard a file of the header, the table
    (8 bytes a sample, page aligned) and the rows (image_size x image_size x 3 bytes each). A budget of only the
    rows leaves the last shards undecoded-for: they are decoded every epoch."""
    row_bytes = image_size * image_size * 3
    return sum(HEADER_BYTES + _table_bytes(count) + count * row_bytes for count in shard_sizes)


class ShardRows:
    """One shard's decoded rows in a cache file (see the module docstring for the layout and the ordering)."""

    def __init__(self, fd: int, num_samples: int, row_bytes: int, checksum: str = DEFAULT_CHECKSUM) -> None:
        self.fd = fd
        self.num_samples = num_samples
        self.row_bytes = row_bytes
        self.rows_at = HEADER_BYTES + _table_bytes(num_samples)
        self.checksum = CHECKSUMS[checksum]

    def _row_offset(self, local: int) -> int:
        return self.rows_at + local * self.row_bytes

    def _entry_offset(self, local: int) -> int:
        return HEADER_BYTES + local * _ENTRY.size

    def read(self, local: int, out: np.ndarray) -> list[int]:
        """Fill out[k] (C-contiguous rows) with sample local + k wherever it was kept whole: one read of the entries,
        then each kept row read and its checksum checked at once (the row still in the CPU cache). Returns the k
        that must be decoded (not kept, cut short, or not what was kept)."""
        count = len(out)
        raw = os.pread(self.fd, count * _ENTRY.size, self._entry_offset(local)).ljust(count * _ENTRY.size, b"\0")
        entries = np.frombuffer(raw, dtype="<u4").reshape(count, 2)
        sums, kept = entries[:, 0].tolist(), (entries[:, 1] == KEPT).tolist()
        checksum, fd, row_bytes, offset = self.checksum, self.fd, self.row_bytes, self._row_offset(local)
        redo = []
        for k in range(count):
            if kept[k]:
                view = out[k].data.cast("B")
                if os.preadv(fd, [view], offset + k * row_bytes) == row_bytes and checksum(view) == sums[k]:
                    continue
            redo.append(k)
        return redo

    def write(self, local: int, pixels: np.ndarray) -> None:
        """Keep sample `local`: the row, then its entry (checksum, KEPT). OSError (e.g. ENOSPC) leaves the entry as
        it was (a row whose checksum does not match is decoded again)."""
        row = np.ascontiguousarray(pixels)
        data = row.data.cast("B")
        if os.pwrite(self.fd, data, self._row_offset(local)) != self.row_bytes:
            raise OSError(errno.ENOSPC, "short write to the decode cache")
        os.pwrite(self.fd, _ENTRY.pack(self.checksum(data), KEPT), self._entry_offset(local))

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
        self.names: set[str] = set()  # this dataset's file names under this key (set by prepare)

    def file_bytes(self, num_samples: int) -> int:
        return bytes_needed(self.key.image_size, [num_samples])

    def prepare(self, shard_sha256s: list[str]) -> None:
        """Create the directory and remove the cache files this code wrote before this boot (their rows may not
        have reached the disk in order). Nothing else is removed: not a file without this code's header (the
        user's), nor a file of another dataset or setting of this boot (another Job's). Run once per rank before the
        workers start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.names = {self.key.file_name(sha) for sha in shard_sha256s}
        for entry in os.scandir(self.directory):
            ours = entry.name.endswith(SUFFIX) or (entry.name.startswith(".") and entry.name.endswith(".tmp")
                                                   and SUFFIX in entry.name)
            if not ours or not entry.is_file(follow_symlinks=False):
                continue
            identity = _identity_of(entry.path)
            if identity is not None and identity.get("boot") != self.key.boot:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _used_bytes(self) -> int:
        total = 0
        for name in self.names:
            with contextlib.suppress(OSError):
                st = os.lstat(self.directory / name)
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        return total

    def open_shard(self, shard_sha256: str, num_samples: int) -> ShardRows | None:
        """The shard's rows, creating its file if the budget allows; None when it does not (read and decode), and
        None for a file at its name that this code did not write for exactly this shard and key (never used, never
        touched)."""
        name = self.key.file_name(shard_sha256)
        path = self.directory / name
        identity = self.key.identity(shard_sha256, num_samples)
        flags = os.O_RDWR | _NOFOLLOW | _NONBLOCK  # rows go into this file, never where a link points
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not self.writable or self._used_bytes() + self.file_bytes(num_samples) > self.budget_bytes:
                return None
            created = self._create(path, identity, num_samples)
            if created is None:
                return None
            fd = created
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                return None  # a link, a directory, a FIFO: not ours
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or read_identity(fd) != identity:
                os.close(fd)
                return None
        except OSError:
            os.close(fd)
            raise
        return ShardRows(fd, num_samples, self.row_bytes, self.key.checksum)

    def _create(self, path: Path, identity: dict[str, Any], num_samples: int) -> int | None:
        """A new file with its header, appearing under its name whole (link of a temp file); the descriptor of the
        file at `path` afterwards (ours, or the one another process created first)."""
        temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        try:
            os.pwrite(fd, _header(identity), 0)
            # Sparse: blocks are allocated as rows land.
            os.ftruncate(fd, self.file_bytes(num_samples))
            try:
                os.link(temp, path)
            except FileExistsError:  # another process was first: use its file
                os.close(fd)
                fd = -1
                try:
                    return os.open(path, os.O_RDWR | _NOFOLLOW | _NONBLOCK)
                except OSError:
                    return None
            return fd
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)


def _identity_of(path: str) -> dict[str, Any] | None:
    """The header identity of the file at `path` (no link followed, no FIFO opened); None when it is not ours."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return read_identity(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
