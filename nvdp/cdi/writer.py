"""Spec files on disk: written atomically (a reader, the container runtime, sees the old file or the
new one, never a partial one), read back with a bound, and told apart by a cheap fingerprint."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

Fingerprint = tuple[int, int, int, int, int]  # device, inode, size, mtime, ctime


def ensure_dir(directory: Path) -> None:
    """Create the spec directory when it is missing. Raises OSError."""
    directory.mkdir(parents=True, exist_ok=True)


def write_atomic(directory: Path, name: str, content: bytes) -> bool:
    """Put `content` at directory/name: a temp file in the same directory, fsync, rename, fsync of
    the directory. Returns False (and writes nothing) when the file already holds `content`.
    Raises OSError when the directory cannot be created or written."""
    target = directory / name
    if read_spec(target, len(content)) == content:
        return False
    ensure_dir(directory)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(directory)
    return True


def read_spec(path: Path, limit: int) -> bytes | None:
    """At most `limit` + 1 bytes of the regular file at `path` (so a longer file never compares
    equal to `limit` bytes); None when it is missing, a symlink, not a regular file (a FIFO is not
    waited on) or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def fingerprint(path: Path) -> Fingerprint | None:
    """What changes when the file at `path` is replaced, removed or written in place; None when
    it is missing."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remove(directory: Path, name: str) -> bool:
    """Remove a spec nvdp no longer offers; False when it was not there."""
    try:
        (directory / name).unlink()
    except FileNotFoundError:
        return False
    return True


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
