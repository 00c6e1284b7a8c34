"""Spec files on disk: written atomically (a reader, the container runtime, sees the old file or the
new one, never a partial one), read back with a bound, and told apart by a cheap fingerprint."""

from __future__ import annotations

import os
from pathlib import Path

from nvdp.base.dirs import make_dirs
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded, write_atomic

Fingerprint = tuple[int, int, int, int, int]  # device, inode, size, mtime, ctime


def ensure_dir(directory: Path) -> None:
    """Create the spec directory when it is missing, 0755 whatever the umask (a stranger's spec would
    run its hooks as root). Raises OSError."""
    make_dirs(directory)


def write_spec(directory: Path, name: str, content: bytes) -> bool:
    """Put `content` at directory/name: a temp file in the same directory, fsync, rename, fsync of
    the directory. Returns False (and writes nothing) when the file already holds `content`.
    Raises OSError when the directory cannot be created or written."""
    target = directory / name
    if read_spec(target, len(content)) == content:
        return False
    ensure_dir(directory)
    write_atomic(target, content)
    return True


def read_spec(path: Path, limit: int) -> bytes | None:
    """The content of the regular file at `path` when it holds at most `limit` bytes; None when it
    is missing, not a regular file (a FIFO is not waited on), larger or unreadable."""
    try:
        return read_bounded(path, limit)
    except UnreadableFile:
        return None


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
