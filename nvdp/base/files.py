"""The files nvdp reads and writes: bounded reads of regular files only, and atomic writes.

- `read_bounded` refuses a path that is no regular file (`/dev/zero`, a FIFO, a directory) or is
  too large, in one line saying what it is, before reading it.
- It stat()s first (no device is opened), opens with O_NONBLOCK (a FIFO swapped in cannot block),
  fstat()s again, and reads at most `limit` + 1 bytes whatever the size claims.
- `/dev/null` is the one non-regular file read, as empty: config-manager links the empty config
  to it.
- `write_atomic` writes every file nvdp hands to another program (CDI specs, node labels, the MPS
  daemon's status): a reader sees the old file or the new one, never part of either.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from nvdp.base.errors import UnreadableFile
from nvdp.base.units import MIB, describe_size

MAX_FILE_BYTES = MIB  # a ConfigMap holds at most 1 MiB; no file nvdp reads needs more

_NULL_DEVICE = os.makedev(1, 3)  # Linux's /dev/null
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """The content of a regular file of at most `limit` bytes (b"" for /dev/null).

    Raises UnreadableFile (one line naming `path`) when the file cannot be opened, is not a regular
    file ("is a FIFO", "is a character device", "is a directory", ...) or holds more than `limit`
    bytes ("larger than 1 MiB"); never reads more than `limit` + 1 bytes."""
    name = os.fspath(path)
    try:
        found = os.stat(name)
        if _is_null_device(found):
            return b""
        _check(name, found, limit)
        fd = os.open(name, OPEN_FLAGS)
    except OSError as error:
        raise UnreadableFile(name, error.strerror or str(error)) from error
    try:
        opened = os.fstat(fd)
        if _is_null_device(opened):
            return b""
        _check(name, opened, limit)  # replaced between stat() and open()
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as error:
        raise UnreadableFile(name, error.strerror or str(error)) from error
    finally:
        os.close(fd)
    if left <= 0:  # the file grew past its stat() size, or /proc-like files that report 0
        raise UnreadableFile(name, f"larger than {describe_size(limit)}")
    return b"".join(chunks)


def _check(name: str, found: os.stat_result, limit: int) -> None:
    kind = not_regular(found.st_mode)
    if kind:
        raise UnreadableFile(name, kind)
    if found.st_size > limit:
        raise UnreadableFile(name, f"larger than {describe_size(limit)}")


def not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "is a directory"),
        (stat.S_ISFIFO, "is a FIFO"),
        (stat.S_ISCHR, "is a character device"),
        (stat.S_ISBLK, "is a block device"),
        (stat.S_ISSOCK, "is a socket"),
    )
    return next((words for test, words in kinds if test(mode)), "is not a regular file")


def _is_null_device(found: os.stat_result) -> bool:
    return stat.S_ISCHR(found.st_mode) and found.st_rdev == _NULL_DEVICE


def write_atomic(path: Path, content: bytes, mode: int = 0o644) -> os.stat_result:
    """Replace `path` by a file holding `content`, with `mode`, in one rename: a temporary file in
    the same directory, fsync, rename, fsync of the directory. Returns the written file's stat (its
    inode and mtime, whatever stands at `path` a moment later). Raises OSError, leaving no temporary
    file behind."""
    import tempfile  # here: a plugin start that writes no file does not load it

    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
            written = os.fstat(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return written


def same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (not removed or replaced since)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
