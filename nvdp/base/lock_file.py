"""Lock files: an exclusive `flock` on a file at a path, held as long as this process needs it.

- The file is opened with O_NOFOLLOW (a symlink is refused, never followed), O_CLOEXEC (a child
  does not inherit the lock) and O_NONBLOCK (a FIFO cannot block); anything but a regular file is
  refused with one line that says what it is.
- It is 0600 whatever the umask; once locked it holds `note`, so a second process says whom it
  waits for (read up to NOTE_BYTES).
- After the flock, the file must still be the one at the path (st_dev, st_ino): a holder that
  removed or replaced it meanwhile did not hand over the lock.
- A wait for the lock is bounded (`tries`).
- Users: the kubelet directory's claim (`nvdp.plugins.kubeletplugin.dir_lock`), the CDI spec directory's
  (`nvdp.node.cdi.publisher`) and the GPU hand-over records' (`nvdp.plugins.handoff.records`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from nvdp.base.files import not_regular, same_file

OWNER_ONLY = 0o600
NOTE_BYTES = 256  # a holder's note longer than this is cut
TRY_EVERY_S = 0.02  # between two tries of a bounded wait
REOPENS = 3  # a file replaced under a waiting process: the new one is tried this often at once
REPLACED = "none (the lock file was removed while locking)"
_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


class LockFile:
    """The lock at `path`: `acquire()`, then `held` while the file at the path is still ours,
    `release()` (removes the file) or `close()` (leaves it)."""

    def __init__(self, path: Path, *, note: str = "") -> None:
        self.path = path
        self._note = note
        self._fd: int | None = None

    @property
    def taken(self) -> bool:
        """This process holds the lock on a file (which may have been removed from the path since)."""
        return self._fd is not None

    @property
    def held(self) -> bool:
        """This process holds the lock on the file that is at the path now."""
        return self._fd is not None and same_file(self._fd, self.path)

    def acquire(
        self, *, tries: int = 1, wait: Callable[[float], object] = time.sleep, every_s: float = TRY_EVERY_S
    ) -> str | None:
        """Take the lock (kept when held already): None once held, else what its holder wrote ("" when
        nothing yet) after `tries` tries `every_s` apart (`wait` sleeps). Raises OSError when the
        file cannot be opened or locked (a symlink, not a regular file, a read-only directory...)."""
        if self.held:
            return None
        self.close()
        holder = ""
        fd: int | None = None
        try:
            for attempt in range(tries):
                if attempt:
                    wait(every_s)
                for _ in range(REOPENS):
                    if fd is None:
                        fd = _open(self.path)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        holder = _note(fd)
                        break
                    if same_file(fd, self.path):
                        self._fd, fd = fd, None
                        self._write_note()
                        return None
                    os.close(fd)  # removed or replaced while this process waited: not the lock
                    fd, holder = None, REPLACED
        finally:
            if fd is not None:
                os.close(fd)
        return holder

    def _write_note(self) -> None:
        """Owner-only, and who holds it; a full disk or a file of another owner leave the lock held
        without them."""
        assert self._fd is not None
        with contextlib.suppress(OSError):
            os.fchmod(self._fd, OWNER_ONLY)
        if self._note:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                os.write(self._fd, f"{self._note}\n".encode())

    def release(self) -> None:
        """Remove the file when it is still ours, and unlock. Idempotent."""
        if self.held:
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.close()

    def close(self) -> None:
        """Unlock, leaving the file. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock


def is_locked(path: Path) -> bool:
    """Whether a process holds the lock at `path` (a shared lock taken here would wait); False when
    no file is there. Raises OSError when the path cannot be opened (a symlink: ELOOP)."""
    try:
        fd = _open_at(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared lock when it was taken
    return False


def _open(path: Path) -> int:
    """The regular file at `path`, created 0600 when missing. Raises OSError naming `path`."""
    fd = _open_at(path, os.O_RDWR | os.O_CREAT)
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind:
            raise OSError(errno.EINVAL, kind, str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_at(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | _OPEN_FLAGS, OWNER_ONLY)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "is a symbolic link", str(path)) from error
        raise


def _note(fd: int) -> str:
    """What the holder wrote: its first line, printable characters only, at most NOTE_BYTES read."""
    try:
        text = os.pread(fd, NOTE_BYTES, 0).decode("utf-8", "replace")
    except OSError:
        text = ""
    return "".join(c for c in text.partition("\n")[0] if c.isprintable()).strip()
