"""One gRPC server on unix sockets, as the kubelet dials plugins: the one socket code of the device
plugin and the DRA plugin. One server may listen on several sockets (the DRA plugin's service and
registration sockets): a Python grpc.Server costs a thread that wakes every 200 ms, so one server,
not one per socket.

- A stale socket (a killed run's, nothing listening) is removed first, said in one line.
- A foreign one (another process listens on it) is left alone: start fails, to be retried.
- The socket is owner-only (0600) from bind() itself: the umask is set around the bind, and the
  file is never chmod-ed after, since a chmod changes its ctime and the socket's identity with it.
- `socket_is_ours()`: each file at the paths is still the one bound (a kubelet restart removes it, a
  cleaned directory replaces it); stop() and abandon() remove only a socket that is ours.
- A socket that cannot be made is one NvdpError line with the OS's reason, which gRPC does not
  give: a plain bind() is tried for it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from nvdp.base.dir_watch import FileId, file_id
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600  # plugin sockets are the kubelet's (root's) alone


class UnixSocketServer:
    """`start()` (NvdpError, one line, when it cannot listen; nothing left running then, and it may
    be called again), an idempotent `stop()`, `socket_is_ours()`, `abandon()`. `add_services(server)`
    adds the servicers to each new grpc.Server; `make_parent` creates a missing socket directory;
    `also`: more sockets the same server listens on, in order after `path` (all of them or none)."""

    def __init__(
        self,
        path: Path,
        add_services: Callable[[grpc.Server], None],
        executor: ThreadPoolExecutor,
        *,
        make_parent: bool = False,
        also: Sequence[Path] = (),
    ) -> None:
        self.socket_path = path
        self.socket_paths = (path, *also)
        self._add_services = add_services
        self._executor = executor
        self._make_parent = make_parent
        self._server: grpc.Server | None = None
        self._ids: dict[Path, FileId | None] = {}

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        self._add_services(server)
        bound: list[Path] = []
        try:
            for path in self.socket_paths:
                self._prepare(path)
                self._listen(server, path)
                bound.append(path)
        except NvdpError:
            server.stop(None)
            for path in bound:
                path.unlink(missing_ok=True)
            raise
        server.start()
        # None when a restarting kubelet wiped the directory just now: socket_is_ours() is then False
        # and the sockets are served again.
        self._server, self._ids = server, {path: file_id(path) for path in self.socket_paths}

    def _prepare(self, path: Path) -> None:
        """Make a missing directory if asked; remove a socket file nothing listens on; refuse one
        another process serves."""
        try:
            if self._make_parent:
                make_dirs(path.parent)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return
            if stat.S_ISSOCK(mode) and _accepts(path):
                raise OSError(errno.EADDRINUSE, "another process serves this socket")
            path.unlink()
        except OSError as error:
            raise _cannot_listen(path, error) from error
        log_event(log, logging.INFO, "removed stale socket", path=str(path))

    def _listen(self, server: grpc.Server, path: Path) -> None:
        old_umask = os.umask(0o777 & ~SOCKET_MODE)  # the mode from bind(): no chmod to change its ctime
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as error:  # gRPC does not say why: a plain bind() does
            raise _cannot_listen(path, _bind_error(path) or error) from error
        finally:
            os.umask(old_umask)
        try:  # another thread's umask meanwhile: not served (a retry binds it again)
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode != SOCKET_MODE:
                raise OSError(
                    errno.EPERM, f"bound with mode {mode:o}, not {SOCKET_MODE:o} (the umask changed)"
                )
        except OSError as error:
            path.unlink(missing_ok=True)
            raise _cannot_listen(path, error) from error

    def socket_is_ours(self) -> bool:
        """Serving, and each socket file is still the one it bound."""
        return self._server is not None and all(map(self._file_is_ours, self.socket_paths))

    def unserved(self) -> list[Path]:
        """The sockets not served now: not listening, or removed or replaced since."""
        if self._server is None:
            return list(self.socket_paths)
        return [path for path in self.socket_paths if not self._file_is_ours(path)]

    def _file_is_ours(self, path: Path) -> bool:
        known = self._ids.get(path)
        return known is not None and file_id(path) == known

    def abandon(self) -> None:
        """Remove the socket files that are ours, without stopping (a stop that did not finish; any
        thread, and it never raises: the process exits next)."""
        for path in reversed(self.socket_paths):
            if self._file_is_ours(path):
                try:
                    path.unlink()
                except OSError:
                    pass

    def stop(self, grace: float = 0.5) -> None:
        """Stop serving (`grace` seconds for calls under way) and remove the sockets that are ours;
        the last of `also` first (a registration socket goes before the socket it names)."""
        ours = [path for path in reversed(self.socket_paths) if self._file_is_ours(path)]
        for path in ours[:-1]:
            path.unlink(missing_ok=True)
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1.0)
        for path in ours[-1:]:
            path.unlink(missing_ok=True)
        self._ids = {}


def _cannot_listen(path: Path, error: Exception) -> NvdpError:
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return NvdpError(f"cannot listen on {path}: {text}")


def _accepts(path: Path) -> bool:
    """Whether something listens on the unix socket at `path` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)  # a full backlog: someone listens
        try:
            probe.connect(os.fsencode(path))
        except TimeoutError:
            return True
        except OSError:
            return False
    return True


def _bind_error(path: Path) -> OSError | None:
    """Why a unix socket cannot be bound at `path` (read-only or full directory, a file in the way,
    path too long), None when a plain bind() works now (its file is removed again)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(os.fsencode(path))
        except OSError as error:
            return error
    try:
        path.unlink()
    except OSError:
        pass
    return None
