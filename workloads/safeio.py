"""Small files another process wrote (cache state, plans, sidecars), read as untrusted input; and written safely.

One helper for every such file, so each read has the same guarantees:
- only a regular file is read: a symlink is never followed (O_NOFOLLOW, and the directory that holds the file is
  opened with O_NOFOLLOW too), a FIFO never blocks (O_NONBLOCK, then fstat must say S_ISREG), a device or a
  directory is an error;
- at most `max_bytes` are read (the size is checked before reading, and the read is bounded too);
- JSON is parsed strictly: an object at the top, and every field's type checked by the caller through `field()`
  (a bool must be a JSON bool: "no" and 0 are not false);
- `StateFile` re-reads only when the file changed (device, inode, size, mtime_ns), so polling a large plan every
  10 ms costs a stat, not a parse.

Writes go to a temp file in the same directory, opened relative to a directory descriptor taken without following
links, fsynced, then renamed over the target: a reader sees the old content or the new, never a partial file, and
a `.cache` that is a symlink is refused instead of written through.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

STATE_MAX_BYTES = 64 << 20  # a plan naming a million shards is ~30 MB; anything larger is not a state file
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StateFileError(ValueError):
    """A state file that cannot be trusted: one line naming the file and why."""

    def __init__(self, where: str | os.PathLike[str], why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = str(where)
        self.why = why


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_dir(path: str | os.PathLike[str], *, create: bool = False, follow: bool = False) -> int:
    """A descriptor of directory `path`; its last component is never a followed symlink unless `follow`.
    FileNotFoundError when it does not exist (and not `create`); StateFileError when it is not a directory."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)  # DEST itself (a link there is the user's choice)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o777)
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        return os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                mode = 0
            raise StateFileError(path, f"is {_kind(mode)}, not a directory (links are not followed)") from None
        raise


def file_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _read_fd(fd: int, size: int, max_bytes: int, where: str) -> bytes:
    chunks, total = [], 0
    while True:
        block = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not block:
            break
        chunks.append(block)
        total += len(block)
        if total > max_bytes:
            raise StateFileError(where, f"larger than {max_bytes} bytes: not a state file")
    return b"".join(chunks)


def read_regular(path: str | os.PathLike[str], max_bytes: int = STATE_MAX_BYTES, *, dir_fd: int | None = None,
                 follow: bool = False, known: tuple[int, int, int, int] | None = None,
                 ) -> tuple[bytes | None, tuple[int, int, int, int] | None]:
    """(content, key) of the regular file at `path` (relative to `dir_fd` when given); (None, None) when it does
    not exist. When `known` equals the file's key, the content is not read: (None, key) says "unchanged".

    Never follows a symlink (unless `follow`, for files a user names), never blocks on a FIFO, never reads more than
    `max_bytes`. StateFileError for anything that is not a regular file of at most that size, or unreadable."""
    where = str(path) if dir_fd is None else str(path)
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateFileError(where, "is a symbolic link (not followed)") from None
        raise StateFileError(where, f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(where, f"is {_kind(st.st_mode)}, not a regular file")
        key = file_key(st)
        if known is not None and key == known:
            return None, key
        if st.st_size > max_bytes:
            raise StateFileError(where, f"{st.st_size} bytes, larger than {max_bytes}: not a state file")
        try:
            return _read_fd(fd, st.st_size, max_bytes, where), key
        except OSError as exc:
            raise StateFileError(where, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_text_file(path: str | os.PathLike[str], max_bytes: int) -> str:
    """A file a user names (a job spec, a stack file, a facts file) as UTF-8 text. A link is followed; a file that
    is missing, not a regular file (a FIFO never blocks), larger than `max_bytes`, not UTF-8 or holding NUL bytes
    is a StateFileError naming it in one line."""
    content, _ = read_regular(path, max_bytes, follow=True)
    if content is None:
        raise StateFileError(path, "cannot read: No such file or directory")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(path, f"not UTF-8 text (byte {exc.start}): is this a binary file?") from None
    if "\x00" in text:
        raise StateFileError(path, "contains NUL bytes: is this a binary file?")
    return text


def parse_json_object(payload: bytes, where: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON object from untrusted bytes; StateFileError (one line) for anything else."""
    try:
        raw = json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StateFileError(where, f"not UTF-8 text (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise StateFileError(where, f"not valid JSON: {first}") from None
    if not isinstance(raw, dict):
        raise StateFileError(where, f"not a JSON object (a {type(raw).__name__})")
    return raw


_MISSING = object()


def field(raw: dict[str, Any], key: str, kind: str, where: str | os.PathLike[str], default: Any = _MISSING) -> Any:
    """`raw[key]` checked strictly against `kind`: "bool", "int>0", "int>=0", "str", "str|null", "int>0|null",
    "list[str]". A missing key takes `default` (an error when there is none)."""
    if key not in raw:
        if default is _MISSING:
            raise StateFileError(where, f"{key}: missing")
        return default
    value = raw[key]
    nullable = kind.endswith("|null")
    base = kind.removesuffix("|null")
    if value is None and nullable:
        return None
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "int>0": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        "int>=0": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "str": lambda v: isinstance(v, str),
        "list[str]": lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
    }[base](value)
    if not ok:
        shown = repr(value)
        shown = shown[:60] + "..." if len(shown) > 60 else shown
        wanted = {"bool": "true or false", "int>0": "a positive integer", "int>=0": "a non-negative integer",
                  "str": "a string", "list[str]": "a list of strings"}[base] + (" or null" if nullable else "")
        raise StateFileError(where, f"{key}: must be {wanted}, got {shown}")
    return value


class StateFile:
    """One state file in a directory, parsed with `parse` only when it changed since the last read.

    `directory` is opened without following a link in its last component (a `.cache` that is a symlink is an
    error, not a way out of DEST); the file itself must be a regular file (see read_regular)."""

    def __init__(self, directory: str | os.PathLike[str], name: str, parse: Callable[[dict[str, Any], str], T],
                 max_bytes: int = STATE_MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.name = name
        self.path = self.directory / name
        self.parse = parse
        self.max_bytes = max_bytes
        self._key: tuple[int, int, int, int] | None = None
        self._value: Any = None

    def read(self) -> Any:
        """The parsed content, or None while the file (or its directory) does not exist."""
        try:
            dir_fd = open_dir(self.directory)
        except FileNotFoundError:
            self._key, self._value = None, None
            return None
        except StateFileError:
            raise
        except OSError as exc:
            raise StateFileError(self.directory, f"cannot open: {exc.strerror or exc}") from None
        try:
            payload, key = read_regular(self.name, self.max_bytes, dir_fd=dir_fd, known=self._key)
        except StateFileError as exc:
            raise StateFileError(self.path, exc.why) from None
        finally:
            os.close(dir_fd)
        if key is None:
            self._key, self._value = None, None
            return None
        if payload is None:  # unchanged
            return self._value
        value = self.parse(parse_json_object(payload, self.path), str(self.path))
        self._key, self._value = key, value
        return value


def atomic_write_in(directory: str | os.PathLike[str], name: str, payload: bytes, *, create_dir: bool = True,
                    mode: int | None = None) -> None:
    """Write `directory/name` whole: temp file, fsync, rename, fsync of the directory. `directory` must not be a
    symlink (StateFileError); OSError carries the path of the file that failed."""
    directory = Path(directory)
    target = directory / name
    dir_fd = open_dir(directory, create=create_dir)
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                         0o666 if mode is None else mode, dir_fd=dir_fd)
            try:
                view = memoryview(payload)
                while view:
                    written = os.write(fd, view)
                    if written == 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
