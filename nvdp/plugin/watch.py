"""Waiting for changes in the kubelet's device-plugin directory without polling.

Linux inotify through ctypes: a kubelet restart deletes our sockets and re-creates kubelet.sock,
and both show up here at once. Where inotify is unavailable we fall back to stat() every 100 ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
from pathlib import Path

log = logging.getLogger(__name__)

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_CLOSE_WRITE = 0x8
IN_MASK_ADD = 0x20000000  # add to a directory's watched events, never drop some another caller asked for
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
_FALLBACK_POLL_S = 0.1


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


FileId = tuple[int, int]


def file_id(path: Path) -> FileId | None:
    """Identity of the file at `path` now: inode number and change time. Inode numbers alone are
    reused at once on ext4, so a re-created socket can carry its predecessor's number."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class DirWatcher:
    """`wait(timeout)` returns when something in `directory` was created, deleted or moved.

    Also woken by `wake()` (from another thread, e.g. a signal handler), so the caller's loop has
    no periodic wake-ups.
    """

    def __init__(self, directory: Path, extra_events: int = 0) -> None:
        """`extra_events`: inotify event bits to watch for besides create/delete/move (e.g.
        IN_CLOSE_WRITE for files written in place)."""
        self.directory = directory
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fd: int | None = None
        libc = self._libc = _libc()
        if libc is not None:
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(directory), _MASK | extra_events) >= 0:
                self._fd = fd
            else:
                err = ctypes.get_errno()
                if fd >= 0:
                    os.close(fd)
                log.warning(
                    "inotify unavailable (%s); polling %s every %.1fs",
                    errno.errorcode.get(err, err),
                    directory,
                    _FALLBACK_POLL_S,
                )

    @property
    def uses_inotify(self) -> bool:
        return self._fd is not None

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float | None) -> bool:
        """Block until a change, a wake() or the timeout. True when a directory change was seen."""
        fds = [self._wake_r] + ([self._fd] if self._fd is not None else [])
        if self._fd is None:
            timeout = _FALLBACK_POLL_S if timeout is None else min(timeout, _FALLBACK_POLL_S)
        ready, _, _ = select.select(fds, [], [], timeout)
        changed = self._fd is None
        for fd in ready:
            try:
                while os.read(fd, 65536):
                    pass
            except BlockingIOError:
                pass
            if fd == self._fd:
                changed = True
        return changed

    def add(self, directory: Path, extra_events: int = 0) -> bool:
        """Also wake on changes in `directory` (idempotent), and on `extra_events` there (e.g.
        IN_CLOSE_WRITE). False when it cannot be watched (no inotify: `wait` polls anyway; or the
        directory is gone)."""
        if self._fd is None or self._libc is None:
            return False
        mask = _MASK | extra_events | IN_MASK_ADD
        return bool(self._libc.inotify_add_watch(self._fd, os.fsencode(directory), mask) >= 0)

    def close(self) -> None:
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = None
        self._wake_r = self._wake_w = -1
