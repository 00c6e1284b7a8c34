"""One gRPC server on a unix socket, as the kubelet dials plugins: the one socket code of the device
plugin and the DRA plugin.

- A stale socket (a killed run's, nothing listening) is removed first, said in one line.
- A foreign one (another process listens on it) is left alone: start fails, to be retried.
- The socket is owner-only (0600) from bind() itself: the umask is set around the bind, and the
  file is never chmod-ed after, since a chmod changes its ctime and the socket's identity with it.
- `socket_is_ours()`: the file at the path is still the one bound (a kubelet restart removes it, a
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from nvdp.dir_watch import FileId, file_id
from nvdp.dirs import make_dirs
from nvdp.errors import NvdpError
from nvdp.logs import log_event

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600  # plugin sockets are the kubelet's (root's) alone


class UnixSocketServer:
    """`start()` (NvdpError, one line, when it cannot listen; nothing left running then, and it may
    be called again), an idempotent `stop()`, `socket_is_ours()`, `abandon()`. `add_services(server)`
    adds the servicers to each new grpc.Server; `make_parent` creates a missing socket directory."""

    def __init__(
        self,
        path: Path,
        add_services: Callable[[grpc.Server], None],
        executor: ThreadPoolExecutor,
        *,
        make_parent: bool = False,
    ) -> None:
        self.socket_path = path
        self._add_services = add_services
        self._executor = executor
        self._make_parent = make_parent
        self._server: grpc.Server | None = None
        self._id: FileId | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            if self._make_parent:
                make_dirs(self.socket_path.parent)
            self._remove_stale()
        except OSError as error:
            raise self._cannot_listen(error) from error
        server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        self._add_services(server)
        self._listen(server)
        server.start()
        # None when a restarting kubelet wiped the directory just now: socket_is_ours() is then False
        # and the socket is served again.
        self._server, self._id = server, file_id(self.socket_path)

    def _remove_stale(self) -> None:
        """Remove a socket file nothing listens on; refuse one another process serves."""
        try:
            mode = os.lstat(self.socket_path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISSOCK(mode) and _accepts(self.socket_path):
            raise OSError(errno.EADDRINUSE, "another process serves this socket")
        self.socket_path.unlink()
        log_event(log, logging.INFO, "removed stale socket", path=str(self.socket_path))

    def _listen(self, server: grpc.Server) -> None:
        old_umask = os.umask(0o777 & ~SOCKET_MODE)  # the mode from bind(): no chmod to change its ctime
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as error:  # gRPC does not say why: a plain bind() does
            raise self._cannot_listen(_bind_error(self.socket_path) or error) from error
        finally:
            os.umask(old_umask)
        try:  # another thread's umask meanwhile: not served (a retry binds it again)
            mode = stat.S_IMODE(os.stat(self.socket_path).st_mode)
            if mode != SOCKET_MODE:
                raise OSError(
                    errno.EPERM, f"bound with mode {mode:o}, not {SOCKET_MODE:o} (the umask changed)"
                )
        except OSError as error:
            server.stop(None)
            self.socket_path.unlink(missing_ok=True)
            raise self._cannot_listen(error) from error

    def _cannot_listen(self, error: Exception) -> NvdpError:
        text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        return NvdpError(f"cannot listen on {self.socket_path}: {text}")

    def socket_is_ours(self) -> bool:
        """Serving, and the socket file is still the one it bound."""
        return self._server is not None and self._file_is_ours()

    def _file_is_ours(self) -> bool:
        return self._id is not None and file_id(self.socket_path) == self._id

    def abandon(self) -> None:
        """Remove the socket file if it is ours, without stopping (a stop that did not finish; any
        thread, and it never raises: the process exits next)."""
        if self._file_is_ours():
            try:
                self.socket_path.unlink()
            except OSError:
                pass

    def stop(self, grace: float = 0.5) -> None:
        """Stop serving (`grace` seconds for calls under way) and remove the socket if it is ours."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1.0)
        if self._file_is_ours():
            self.socket_path.unlink(missing_ok=True)
        self._id = None


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
