"""The stand-in's Registration server on `kubelet.sock`: checks a RegisterRequest, dials the plugin.

Like the kubelet's device manager, it checks the version and resource name, dials the plugin (blocking,
before Register answers) and asks for its options; what follows (replacing an earlier plugin of the
same resource, keeping the stream) belongs to a `PluginHandler`, the stand-in's device state. A server
generation ends at `stop`: a Register call still in flight then is refused as "kubelet is restarting".
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, NamedTuple, NoReturn, Protocol

import grpc

from nvdp.api import pb, pb_grpc
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import KubeletError
from nvdp.sim.kubelet.endpoint import ListAndWatchReceiver, PluginEndpoint
from nvdp.sim.kubelet.validation import endpoint_problem, registration_problem

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
MAX_SOCKET_PATH = 107  # bytes, sun_path less its terminating NUL

SocketState = Literal["stopped", "refusing", "serving"]


class Registration(NamedTuple):
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    time: float  # time.monotonic() when the Register call arrived


class Rejection(NamedTuple):
    resource: str
    endpoint: str
    version: str
    message: str
    time: float


class PluginHandler(ListAndWatchReceiver, Protocol):
    """What the Registration server tells the device state (the kubelet's PluginConnected and kin)."""

    def socket_state_changed(self, state: SocketState) -> None: ...

    def plugin_connected(self, plugin: PluginEndpoint, registration: Registration) -> PluginEndpoint | None:
        """Take `plugin` as the one of its resource and start its stream; return the plugin it replaces."""
        ...

    def registration_refused(self, rejection: Rejection) -> None: ...


def cleanup_plugin_dir(plugin_dir: Path) -> list[str]:
    """Remove every socket in `plugin_dir` except the checkpoint, as the kubelet does at start."""
    removed = []
    for entry in os.scandir(plugin_dir):
        if entry.name == CHECKPOINT_FILE:
            continue
        try:
            if stat.S_ISSOCK(os.stat(entry.path).st_mode):
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:
            continue
    return removed


class _RegistrationService:
    """The Registration servicer; bound to one server generation so stale calls can be refused."""

    def __init__(self, register: Callable[[pb.RegisterRequest, Any], pb.Empty]) -> None:
        self._register = register

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        return self._register(request, context)


class RegistrationServer:
    """`serve` kubelet.sock in `plugin_dir`, `stop` it; one serve per stop. Not itself serialized: the
    caller (`Kubelet`) runs serve and stop one at a time."""

    def __init__(
        self, plugin_dir: Path, handler: PluginHandler, *, dial_timeout: float, workers: int
    ) -> None:
        self.plugin_dir = plugin_dir
        self.socket_path = plugin_dir / KUBELET_SOCKET
        self.dial_timeout = dial_timeout
        self._handler = handler
        self._workers = workers
        self._lock = threading.Lock()  # guards the generation; held while a plugin is handed over
        self._generation = 0
        self._server: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._dialing: set[PluginEndpoint] = set()

    def serve(self, accept_delay: float) -> None:
        """Clean the plugin directory and serve Registration on kubelet.sock.

        With `accept_delay`, kubelet.sock exists but refuses connections (ECONNREFUSED) for that many
        seconds first; returns once it serves.
        """
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise KubeletError(f"socket path {self.socket_path} is longer than {MAX_SOCKET_PATH} bytes")
        make_dirs(self.plugin_dir)
        removed = cleanup_plugin_dir(self.plugin_dir)
        if removed:
            log.info("removed plugin sockets dir=%s sockets=%s", self.plugin_dir, ",".join(sorted(removed)))
        with self._lock:
            generation = self._generation
        placeholder = None
        try:
            if accept_delay > 0:
                # Bound but not listening: the file is there and connects fail with ECONNREFUSED.
                placeholder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                placeholder.bind(os.fsencode(self.socket_path))
                self._handler.socket_state_changed("refusing")
                time.sleep(accept_delay)
            executor = ThreadPoolExecutor(self._workers, thread_name_prefix="kubelet-registration")
            server = grpc.server(executor)
            service = _RegistrationService(functools.partial(self._register, generation))
            pb_grpc.add_RegistrationServicer_to_server(service, server)
            try:
                server.add_insecure_port(f"unix:{self.socket_path}")  # replaces the placeholder's file
                server.start()
            except Exception as e:
                executor.shutdown(wait=True)
                raise KubeletError(f"cannot serve {self.socket_path}: {e}") from e
        except BaseException:
            self._handler.socket_state_changed("stopped")
            raise
        finally:
            if placeholder is not None:
                placeholder.close()
        with self._lock:
            self._server, self._executor = server, executor
        self._handler.socket_state_changed("serving")
        log.info("kubelet serving socket=%s", self.socket_path)

    def stop(self) -> None:
        """End this generation: stop serving, close plugins still being dialed, wait for Register calls."""
        with self._lock:
            self._generation += 1
            server, executor = self._server, self._executor
            self._server, self._executor = None, None
            dialing = list(self._dialing)
        if server is not None:
            server.stop(None).wait()
        for plugin in dialing:
            plugin.close()
        if executor is not None:
            executor.shutdown(wait=True)

    def _register(self, generation: int, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        arrived = time.monotonic()
        resource, endpoint = request.resource_name, request.endpoint
        log.info(
            "registration request resource=%s endpoint=%s version=%s", resource, endpoint, request.version
        )
        problem = registration_problem(request.version, resource) or endpoint_problem(
            self.plugin_dir, endpoint
        )
        if problem:
            self._reject(context, request, arrived, problem)

        plugin = PluginEndpoint(resource, self.plugin_dir / endpoint, self._handler)
        with self._lock:
            if generation != self._generation:
                plugin.close()
                self._reject(context, request, arrived, "kubelet is restarting", grpc.StatusCode.UNAVAILABLE)
            self._dialing.add(plugin)
        try:
            options = plugin.connect(self.dial_timeout)
        except grpc.RpcError as e:
            plugin.close()
            self._reject(
                context, request, arrived, f"failed to dial device plugin: {e.code().name}: {e.details()}"
            )
        finally:
            with self._lock:
                self._dialing.discard(plugin)

        with self._lock:
            if generation != self._generation:
                plugin.close()
                self._reject(context, request, arrived, "kubelet is restarting", grpc.StatusCode.UNAVAILABLE)
            old = self._handler.plugin_connected(plugin, Registration(resource, endpoint, options, arrived))
        if old is not None:
            log.info("replacing plugin resource=%s old=%s new=%s", resource, old.socket_path.name, endpoint)
            old.close()
            old.join()
        log.info(
            "plugin registered resource=%s endpoint=%s pre_start_required=%s "
            "get_preferred_allocation_available=%s",
            resource,
            endpoint,
            options.pre_start_required,
            options.get_preferred_allocation_available,
        )
        return pb.Empty()

    def _reject(
        self,
        context: Any,
        request: pb.RegisterRequest,
        arrived: float,
        message: str,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,  # what a plain Go error becomes on the wire
    ) -> NoReturn:
        log.info("registration refused resource=%s reason=%r", request.resource_name, message)
        self._handler.registration_refused(
            Rejection(request.resource_name, request.endpoint, request.version, message, arrived)
        )
        context.abort(code, message)
        raise AssertionError("context.abort returned")
