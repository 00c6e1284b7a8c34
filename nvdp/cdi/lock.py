"""The spec directory claimed for this process's specs: an exclusive `flock` on a lock file in it.

Two device plugins writing the same spec files would overwrite each other's specs without a word, so
before writing, nvdp takes `fcntl.flock` on `<spec dir>/.<vendor>.lock` (a hidden name the CDI library
does not read) and writes who it is there (`pid=... host=...`; in a pod the host name is the pod's
name). A second plugin finds the lock held, says by whom, and does not write (`nvdp.cdi.publisher`
withholds its resources and tries again). The lock is held while the process serves CDI and released
on stop; the holder removes the lock file then, which wakes a waiting plugin's spec-directory watch.
A lock file removed under its holder (the directory deleted) is taken again on the next publish.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from nvdp.files import same_file

HOLDER_BYTES = 256  # a holder line longer than this is cut
OWNER_ONLY = 0o600


def lock_path(spec_dir: Path, vendor: str) -> Path:
    return spec_dir / f".{vendor}.lock"


class SpecDirLock:
    def __init__(self) -> None:
        self.path: Path | None = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None and self.path is not None and same_file(self._fd, self.path)

    def acquire(self, path: Path) -> str | None:
        """Hold the lock at `path` (kept when already held there): None on success, else who holds
        it. Raises OSError when the lock file cannot be created or locked (read-only directory...)."""
        if self.path == path and self.held:
            return None
        self.release()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, OWNER_ONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _holder(fd)  # closes fd
            if not same_file(fd, path):  # removed by its holder between our open and flock
                os.close(fd)
                return "none (the lock file was removed while locking)"
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode())
            except OSError:
                pass  # a full disk: the lock holds without the note
        except BaseException:
            os.close(fd)
            raise
        self._fd, self.path = fd, path
        return None

    def release(self) -> None:
        """Remove the lock file when it is still ours, and unlock. Idempotent."""
        fd, path = self._fd, self.path
        self._fd = self.path = None
        if fd is None:
            return
        if path is not None and same_file(fd, path):
            try:
                path.unlink()
            except OSError:
                pass
        os.close(fd)  # closing the last descriptor releases the flock


def _holder(fd: int) -> str:
    """Who holds the lock, as its lock file says (printable characters only), and closes `fd`."""
    try:
        text = os.pread(fd, HOLDER_BYTES, 0).decode("utf-8", "replace")
    except OSError:
        text = ""
    finally:
        os.close(fd)
    line = "".join(c for c in text.partition("\n")[0] if c.isprintable()).strip()
    return line or "unknown (it has not said who it is yet)"
