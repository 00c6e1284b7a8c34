"""Writing spec files atomically: a reader (the container runtime) sees the old file or the new
one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from nvdp.dirs import make_dirs
from nvdp.errors import UnreadableFile
from nvdp.files import read_bounded


def write_atomic(directory: Path, name: str, content: bytes) -> bool:
    """Put `content` at directory/name: a temp file in the same directory, fsync, rename, fsync of
    the directory. Returns False (and writes nothing) when the file already holds `content`.
    Raises OSError when the directory cannot be created or written."""
    target = directory / name
    try:  # bounded: whatever is there (a FIFO, a huge file) is read no further than `content` goes
        if read_bounded(target, len(content)) == content:
            return False
    except UnreadableFile:
        pass
    make_dirs(directory)  # 0755 whatever the umask: a stranger's spec would run its hooks as root
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
