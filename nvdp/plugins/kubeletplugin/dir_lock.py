"""A plugin's directory, claimed: created if missing, and locked for the process's life (the device
plugin's kubelet directory; the DRA plugin's plugin directory, with its own lock name).

- The lock is `DIR/nvidia-device-plugin.lock` (`nvdp.base.lock_file`) with the pid: two instances would
  delete each other's sockets as stale. A second says who holds it and waits, or exits 1 with
  fail-on-init-error.
- An unusable directory (read-only, no directory, no permission) is one line, retried with backoff.
- The claim is on the path: `refresh()` (each main-loop wake) locks a new file at the path again,
  so a waiting instance cannot take it; while it cannot, it says so once with when to retry.
- After start nvdp never creates the directory: that is the kubelet's (or its installer's) job.
- In a pod a removed host directory stays mounted as removed: said in the same line, and
  `stale_mount` fails /healthz so the kubelet restarts the container onto the new one.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nvdp.base.backoff import Backoff
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import DirLockHeld as DirLockHeld  # defined in nvdp.base.errors
from nvdp.base.lock_file import REPLACED, LockFile
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

LOCK_NAME = "nvidia-device-plugin.lock"
RETRY_MIN_S = 0.05
RETRY_MAX_S = 5.0
HELD_POLL_S = 1.0  # how often a waiting instance tries the lock again
STALE_MOUNT = (
    "the directory was removed, and this mount of it is stale: restart the container to mount the new one"
)


class DirClaim:
    """Claims `directory` for this process: `acquire()` once, `refresh()` on wake-ups, `release()`.
    `what` names the directory in messages; `lock_name` is the lock file's name in it (the DRA
    plugin claims its own directory the same way: `nvdp.commands`)."""

    def __init__(
        self,
        directory: Path,
        *,
        fail_if_held: bool,
        clock: Callable[[], float] = time.monotonic,
        what: str = "kubelet directory",
        lock_name: str = LOCK_NAME,
    ) -> None:
        self.directory = directory
        self.what = what
        self._clock = clock
        self.path = directory / lock_name
        self._fail_if_held = fail_if_held
        self._lock = LockFile(self.path, note=f"pid={os.getpid()}")
        self._claimed = False  # acquired and not released: refresh() keeps the lock at the path
        self._retries = Backoff(RETRY_MIN_S, RETRY_MAX_S)  # refresh()'s, while the lock cannot be taken
        self._retry_at: float | None = None  # when refresh() tries to lock again
        self._said: str | None = None  # the error last said (unusable directory)
        self._stale = False  # the path names a removed directory (a stale mount)

    @property
    def held(self) -> bool:
        return self._lock.taken

    def acquire(self, stop: threading.Event) -> bool:
        """Block until the directory is usable and locked (True) or `stop` is set (False). Raises
        DirLockHeld when another process holds it and `fail_if_held`."""
        retries = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        self._said = None
        said_held: str | None = None
        while not stop.is_set():
            try:
                make_dirs(self.directory)
                holder = self._try_lock()
            except OSError as error:
                self._say_unusable(_one_line(error))
                retries.wait(stop.wait)
                continue
            if holder is None:
                if self._said is not None or said_held is not None:
                    log_event(log, logging.INFO, f"{self.what} claimed", path=str(self.path))
                self._said, self._claimed = None, True
                return True
            message = (
                f"{self.what} {self.directory} is in use by another nvdp "
                f"(lock {self.path} held by pid={holder})"
            )
            if self._fail_if_held:
                raise DirLockHeld(message)
            if holder != said_held:
                log_event(
                    log,
                    logging.WARNING,
                    f"{self.what} in use by another instance; waiting (fail-on-init-error=false)",
                    path=str(self.path),
                    pid=holder,
                )
                said_held = holder
            stop.wait(HELD_POLL_S)
        return False

    def refresh(self) -> float | None:
        """Lock again when the lock file at the path is no longer ours (a kubelet restart emptied
        the directory, or the directory was replaced). None while the claim holds, else the delay
        before the next try: the first 50 ms after the file went (a directory being removed is
        not filled again under `rm -rf`), then backoff doubling to 5 s. Raises DirLockHeld when
        another process took the directory meanwhile."""
        if not self._claimed or self._lock.held:
            return None
        self._lock.close()
        now = self._clock()
        if self._retry_at is None:  # just gone: not at once, an `rm -rf` may be under way
            self._retry_at = now + self._retries.next()
        if now < self._retry_at:
            return self._retry_at - now
        try:
            holder = self._try_lock()
        except OSError as error:
            self._stale = _removed(self.directory)
            self._say_unusable(_one_line(error) + (f"; {STALE_MOUNT}" if self._stale else ""))
            delay = self._retries.next()
            self._retry_at = now + delay
            return delay
        if holder is not None:
            raise DirLockHeld(
                f"{self.what} {self.directory} was taken by another nvdp while the kubelet "
                f"restarted (lock {self.path} held by pid={holder})"
            )
        if self._said is not None:
            log_event(log, logging.INFO, f"{self.what} claimed", path=str(self.path))
        else:
            log_event(log, logging.INFO, "lock file re-created", path=str(self.path))
        self._said, self._retry_at, self._stale = None, None, False
        self._retries.reset()
        return None

    def _say_unusable(self, text: str) -> None:
        """The directory cannot be used (`text`: why): said once per error, retried."""
        if text != self._said:
            log_event(
                log,
                logging.ERROR,
                f"{self.what} unusable; retrying",
                path=str(self.directory),
                error=text,
            )
            self._said = text

    @property
    def problem(self) -> str | None:
        """Why the claim does not hold now (the error refresh() last met), None while it holds."""
        return self._said if self._claimed and not self._lock.taken else None

    @property
    def stale_mount(self) -> bool:
        """The claim cannot hold because the path names a removed directory (see the module)."""
        return self._stale and self._claimed and not self._lock.taken

    def release(self) -> None:
        """Remove the lock file when it is still ours and unlock. Idempotent."""
        self._claimed = False
        self._lock.release()

    def _try_lock(self) -> str | None:
        """Lock the file at `path`: None on success, else the holder's pid. Raises OSError."""
        holder = self._lock.acquire()
        if holder is None or holder == REPLACED:
            return holder
        pid = holder.removeprefix("pid=")
        return pid if pid.isdigit() else "unknown"


def _removed(directory: Path) -> bool:
    """`directory` names a directory that was removed: reachable by its path only as the root of a
    mount whose source is gone."""
    try:
        return os.stat(directory).st_nlink == 0
    except OSError:
        return False


def _one_line(error: OSError) -> str:
    name = errno.errorcode.get(error.errno or 0, "")
    where = f": {error.filename}" if error.filename else ""
    return f"{error.strerror or error}{f' ({name})' if name else ''}{where}"
