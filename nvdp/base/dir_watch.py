"""Waiting for changes at a directory without polling: the kubelet's device-plugin directory, the
config-manager's config directory, the node-fact directories.

It uses Linux inotify through ctypes and follows the directory's *path*, not its first inode: a
kubelet restart re-creates kubelet.sock, a reinstall may replace the directory or a symlink to it.
- Watched: the directory's entries; every path component (each parent, symlink and symlink target)
  for IN_DELETE_SELF / IN_MOVE_SELF; a missing component, and the directory itself, by name in its
  parent (a removed directory's IN_DELETE_SELF waits until nothing holds it, and a socket does).
- Any of these, or a dropped watch (IN_IGNORED, IN_UNMOUNT), wakes the waiter; the watches are
  armed again on what the path names now before `wait` returns.
- Other entries of the parents do not end the wait; grandparents and above are not watched while
  the path resolves.
- Without inotify it falls back to stat() every 100 ms.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import stat
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_DONT_FOLLOW = 0x2000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_ENTRIES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
_SELF = IN_DELETE_SELF | IN_MOVE_SELF
_GONE = _SELF | IN_UNMOUNT | IN_IGNORED  # the watched inode is no longer what the path names
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_MAX_SYMLINKS = 40  # as the kernel's path lookup
_MAX_STEPS = 1000  # lookups per arming: a path that keeps changing is armed again on its next event
_FALLBACK_POLL_S = 0.1


def _libc() -> ctypes.CDLL | None:
    try:
        libc = _load_libc()
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def _load_libc() -> ctypes.CDLL:
    """glibc's libc.so.6, else the C library ctypes finds (`find_library` runs `ldconfig -p` in a
    child process: only where glibc's name does not load)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        from ctypes.util import find_library

        name = find_library("c")
        if name is None:
            raise
        return ctypes.CDLL(name, use_errno=True)


FileId = tuple[int, int]


def file_id(path: Path) -> FileId | None:
    """Identity of the file at `path` now: inode number and change time; None when nothing is there
    (also when a file or a dangling link stands where a directory on the path should be). Inode
    numbers alone are reused at once on ext4, so a re-created socket can carry its predecessor's."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class Watcher(Protocol):
    """What a loop sleeps in (`DirWatcher`, a test's fake): woken by a change in the directories it
    follows or by `wake()`; the parts that serve by node facts `add` their directories to it."""

    def wait(self, timeout: float | None) -> bool: ...
    def add(self, directory: Path, extra_events: int = ..., names: Names = ...) -> bool: ...
    def wake(self) -> None: ...
    def close(self) -> None: ...


Names = frozenset[str] | None  # the entry names that matter in a watched directory; None: every event


class DirWatcher:
    """`wait(timeout)` returns when something in `directory` was created, deleted or moved, or
    when what `directory` names changed (see the module's docstring).

    Also woken by `wake()` (from another thread, e.g. a signal handler), so the caller's loop has
    no periodic wake-ups.
    """

    def __init__(self, directory: Path, extra_events: int = 0) -> None:
        """`extra_events`: inotify event bits to watch for in `directory` besides create/delete/move
        (e.g. IN_CLOSE_WRITE for files written in place)."""
        self.directory = directory
        self._content_mask = _ENTRIES | _SELF | extra_events
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fd: int | None = None
        self._watches: dict[int, Names] = {}  # watch descriptor -> what matters there
        self._added: dict[Path, tuple[int, Names]] = {}  # `add`ed directories -> extra events, names
        libc = self._libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC) if libc is not None else -1
        if fd < 0:
            self._polling(ctypes.get_errno() if libc is not None else errno.ENOSYS)
            return
        self._fd = fd
        self._arm()

    @property
    def uses_inotify(self) -> bool:
        return self._fd is not None

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float | None) -> bool:
        """Block until a change, a wake() or the timeout. True when a change was seen. Events that
        do not matter (another entry in a parent directory) do not end the wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._fd is None:
                left = _FALLBACK_POLL_S if left is None else min(left, _FALLBACK_POLL_S)
            fds = [self._wake_r] + ([self._fd] if self._fd is not None else [])
            ready, _, _ = select.select(fds, [], [], left)
            if self._fd is None:
                _drain(self._wake_r)
                return True
            woken = self._wake_r in ready
            if woken:
                _drain(self._wake_r)
            changed = self._fd in ready and self._read_events()
            if changed or woken or not ready or left == 0.0:
                return changed

    def add(self, directory: Path, extra_events: int = 0, names: Names = None) -> bool:
        """Also wake on changes in `directory` (idempotent), and on `extra_events` there (e.g.
        IN_CLOSE_WRITE for files written in place); with `names`, only on changes of those entries
        (a parent watched for one directory to appear: /tmp or /var/lib/kubelet/plugins have other
        traffic). False when it cannot be watched (no inotify: `wait` polls anyway; or the directory
        is gone)."""
        if self._fd is None:
            return False
        old_extra, old_names = self._added.get(directory, (0, frozenset()))
        extra = old_extra | extra_events
        if directory in self._added:
            names = None if names is None or old_names is None else old_names | names
        wd = self._add_watch(directory, self._content_mask | extra)
        if wd < 0:
            return False
        self._added[directory] = (extra, names)
        before = self._watches.get(wd, frozenset())
        self._watches[wd] = None if names is None or before is None else before | names
        return True

    def close(self) -> None:
        # Forget the descriptors before closing them: a late wake() from another thread then writes
        # to -1 (EBADF, ignored), never into a descriptor number the process has reused meanwhile.
        fds = (self._fd, self._wake_r, self._wake_w)
        self._fd = None
        self._wake_r = self._wake_w = -1
        for fd in fds:
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # ---- inotify ------------------------------------------------------------------------------
    def _read_events(self) -> bool:
        """Read every queued event; re-arm when what the path names may have changed. True when
        an event matters."""
        assert self._fd is not None
        matters = rearm = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:  # events were lost: anything may have changed
                    matters = rearm = True
                    continue
                if wd not in self._watches:
                    continue  # a watch dropped by an earlier re-arm
                names = self._watches[wd]
                if mask & _GONE:
                    matters = rearm = True
                elif names is None:
                    matters = True
                elif os.fsdecode(name) in names:
                    matters = rearm = True
        if rearm:
            self._arm()
        return matters

    def _arm(self) -> None:
        """Watch what `directory` names now (see the module's docstring).

        Top down, each component is watched before it is looked at, so a change made while arming
        is either seen by the look or reported by the watch."""
        watches: dict[int, Names] = {}
        masks: dict[int, int] = {}

        def watch(path: str, mask: int, names: Names) -> bool:
            wd = self._add_watch(Path(path), mask) if self._fd is not None else -1
            if wd < 0:
                return False
            if wd in masks and masks[wd] & ~mask:  # the same inode reached twice: keep both
                mask |= masks[wd]
                self._add_watch(Path(path), mask)
            masks[wd] = mask
            before = watches.get(wd, frozenset())
            watches[wd] = None if names is None or before is None else before | names
            return True

        current = "/"
        pending = list(Path(os.path.abspath(self.directory)).parts[1:])
        links = 0
        for _ in range(_MAX_STEPS):
            if not pending or self._fd is None:
                break
            name = pending[0]
            if name == "..":
                current = os.path.dirname(current)
                pending.pop(0)
                continue
            candidate = os.path.join(current, name)
            last = len(pending) == 1
            if last and not watch(current, _ENTRIES | _SELF, frozenset({name})):
                break  # the parent went meanwhile: its own watch has reported it
            mask = (self._content_mask if last else _SELF) | IN_DONT_FOLLOW
            if not watch(candidate, mask, None if last else frozenset()):
                # Missing: watch for its name in the parent, then look again.
                if not watch(current, _ENTRIES | _SELF, frozenset({name})) or not os.path.lexists(candidate):
                    break  # its creation (or the parent's going) will be seen
                continue  # made meanwhile: watch it
            try:
                st = os.lstat(candidate)
            except OSError:
                continue  # gone meanwhile (its watch says so too): look again
            pending.pop(0)
            if stat.S_ISLNK(st.st_mode):  # the link itself is watched: re-pointing replaces it
                links += 1
                try:
                    target = os.readlink(candidate)
                except OSError:
                    break
                if links > _MAX_SYMLINKS:
                    break
                if os.path.isabs(target):
                    current = "/"
                pending[:0] = [p for p in Path(target).parts if p not in ("/", ".")]
            elif stat.S_ISDIR(st.st_mode):
                current = candidate
            else:
                break  # a file where a directory should be: watched until it is replaced
        for directory, (extra, names) in list(self._added.items()):
            if not watch(str(directory), self._content_mask | extra, names):
                del self._added[directory]
        if self._fd is None:  # gave up on inotify while arming
            return
        for wd in set(self._watches) - set(watches):
            self._libc_call().inotify_rm_watch(self._fd, wd)
        self._watches = watches

    def _add_watch(self, directory: Path, mask: int) -> int:
        """The watch descriptor, or -1 when `directory` cannot be watched now. Out of watches or
        memory, inotify is given up for polling."""
        assert self._fd is not None
        wd: int = self._libc_call().inotify_add_watch(self._fd, os.fsencode(directory), mask)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSPC, errno.ENOMEM):
                self._polling(err)
        return wd

    def _libc_call(self) -> ctypes.CDLL:
        assert self._libc is not None
        return self._libc

    def _polling(self, err: int) -> None:
        log.warning(
            "inotify unavailable (%s); polling %s every %.1fs",
            errno.errorcode.get(err, err),
            self.directory,
            _FALLBACK_POLL_S,
        )
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._watches.clear()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except (BlockingIOError, OSError):
        pass


def call_aside(call: Callable[[], T], watcher: Watcher, stop: threading.Event, name: str) -> T | None:
    """`call()` on a thread of its own while the caller's loop waits on `watcher` for its result or
    `stop`: a call that blocks (a config file on a hung mount) cannot hold a stop back. None when the
    stop came first (the call is left behind; the process is ending). Raises what `call` raised."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as error:
            done.set_exception(error)
        finally:
            watcher.wake()

    threading.Thread(target=run, name=name, daemon=True).start()
    while not done.done():
        if stop.is_set():
            return None
        watcher.wait(None)
    return done.result()
