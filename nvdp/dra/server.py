"""The DRA kubelet plugin's two gRPC servers on unix sockets, as the kubelet's plugin manager expects
them (k8s.io/dynamic-resource-allocation/kubeletplugin's layout):

- `<plugins_registry>/gpu.nvidia.com-reg.sock`: the Registration service. GetInfo says type
  DRAPlugin, the driver's name, the DRA socket's path and the services it serves ("v1.DRAPlugin",
  "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"); the kubelet's
  NotifyRegistrationStatus is logged.
- `<plugins>/gpu.nvidia.com/dra.sock`: DRAPlugin v1 and v1beta1 (NodePrepareResources,
  NodeUnprepareResources, one answer per claim: `nvdp.dra.prepare`; each answer told to a
  `RequestObserver`, the metrics') and DRAResourceHealth v1 and v1alpha1 (`nvdp.dra.health`).

Each socket is owner-only (0600); `UnixServer.is_ours()` tells when its file was removed or replaced
(a kubelet reinstall, a cleaned directory), and the driver then serves it again: the kubelet finds the
new registration socket and registers the plugin again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import grpc

from nvdp.api.dra import DRA_PLUGIN, PLUGIN_TYPE, RESOURCE_HEALTH, Wire, registration
from nvdp.dir_watch import FileId, file_id
from nvdp.dirs import make_dirs
from nvdp.dra.claims import ClaimRef
from nvdp.dra.health import HealthStreams
from nvdp.dra.names import DRIVER_NAME
from nvdp.dra.prepare import ClaimPreparer
from nvdp.errors import NvdpError
from nvdp.logs import log_event

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
SERVICES = (*DRA_PLUGIN, *RESOURCE_HEALTH)  # the supported versions GetInfo names, newest first


class UnixServer:
    """One gRPC server on a unix socket: `start()` (replacing a stale socket; NvdpError, one line,
    when it cannot listen), an idempotent `stop()`, `is_ours()`, `abandon()`."""

    def __init__(
        self, path: Path, add_services: Callable[[grpc.Server], None], executor: ThreadPoolExecutor
    ) -> None:
        self.path = path
        self._add_services = add_services
        self._executor = executor
        self._server: grpc.Server | None = None
        self._id: FileId | None = None

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            make_dirs(self.path.parent)
            self.path.unlink(missing_ok=True)
        except OSError as error:
            raise NvdpError(f"cannot listen on {self.path}: {error.strerror or error}") from error
        server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        self._add_services(server)
        old_umask = os.umask(0o777 & ~SOCKET_MODE)  # the mode from bind(): no chmod to change its ctime
        try:
            server.add_insecure_port(f"unix://{self.path}")
            if os.stat(self.path).st_mode & 0o777 != SOCKET_MODE:  # a thread's umask meanwhile
                os.chmod(self.path, SOCKET_MODE)
        except (RuntimeError, OSError) as error:
            server.stop(None)
            raise NvdpError(f"cannot listen on {self.path}: {error}") from error
        finally:
            os.umask(old_umask)
        server.start()
        self._server, self._id = server, file_id(self.path)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def is_ours(self) -> bool:
        """Serving, and the socket file is still the one it bound."""
        return self._server is not None and self._id is not None and file_id(self.path) == self._id

    def abandon(self) -> None:
        """Remove the socket file if it is ours, without stopping (a stop that did not finish)."""
        if self._id is not None and file_id(self.path) == self._id:
            self.path.unlink(missing_ok=True)

    def stop(self, grace: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1.0)
        if self._id is not None and file_id(self.path) == self._id:
            self.path.unlink(missing_ok=True)
        self._id = None


class RegistrationService:
    """pluginregistration.Registration for the kubelet's plugin watcher; `on_info()` is told each GetInfo
    (a registration begins), `on_registered(first)` each registration the kubelet reports."""

    def __init__(
        self,
        endpoint: Path,
        on_registered: Callable[[bool], None] | None = None,
        on_info: Callable[[], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._on_registered = on_registered
        self._on_info = on_info
        self.registered = threading.Event()
        self.last_status: tuple[bool, str] | None = None  # what the kubelet said last (bounded: a
        # client calling NotifyRegistrationStatus over and over grows nothing)

    def problem(self) -> str | None:
        """None when the kubelet's last word was that the plugin is registered, else why not."""
        if self.last_status is None:
            return "not registered with the kubelet"
        registered, error = self.last_status
        return None if registered else f"the kubelet refused the registration: {error}"

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self._on_info is not None:
            self._on_info()
        return registration.pb.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER_NAME, endpoint=str(self.endpoint), supported_versions=list(SERVICES)
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.last_status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log_event(
                log,
                logging.INFO,
                "registered with the kubelet",
                driver=DRIVER_NAME,
                endpoint=str(self.endpoint),
            )
            first = not self.registered.is_set()
            self.registered.set()
            if self._on_registered is not None:
                self._on_registered(first)
        else:
            log_event(
                log,
                logging.ERROR,
                "the kubelet refused the registration",
                driver=DRIVER_NAME,
                error=request.error,
            )
        return registration.pb.RegistrationStatusResponse()

    def add_to(self, server: grpc.Server) -> None:
        registration.grpc.add_RegistrationServicer_to_server(self, server)


class RequestObserver(Protocol):
    """Told of every NodePrepareResources / NodeUnprepareResources answered (`nvdp.dra.status`)."""

    def request_done(self, method: str, code: grpc.StatusCode, seconds: float, errors: Sequence[str]) -> None:
        """`method` answered with `code` after `seconds`; `errors`: each claim's error ("" when none)."""
        ...


class DraService:
    """DRAPlugin of one version (the kubelet picks the newest it knows of those GetInfo names)."""

    def __init__(self, wire: Wire, preparer: ClaimPreparer, observer: RequestObserver | None = None) -> None:
        self._pb = wire.pb
        self._preparer = preparer
        self._observer = observer

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started, errors = time.monotonic(), None
        try:
            answers = self._preparer.prepare([_ref(c) for c in request.claims])
            errors = [answer.error for answer in answers.values()]
        finally:
            self._done("NodePrepareResources", started, errors)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if answer.error:
                entry.error = answer.error
                continue
            for d in answer.devices:
                entry.devices.add(
                    request_names=list(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started, errors = time.monotonic(), None
        try:
            answers = self._preparer.unprepare([_ref(c) for c in request.claims])
            errors = list(answers.values())
        finally:
            self._done("NodeUnprepareResources", started, errors)
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response

    def _done(self, method: str, started: float, errors: Sequence[str] | None) -> None:
        """Count one answer; `errors` None: the call failed as a whole (a bug: gRPC answers UNKNOWN)."""
        if self._observer is not None:
            code = grpc.StatusCode.OK if errors is not None else grpc.StatusCode.UNKNOWN
            self._observer.request_done(method, code, time.monotonic() - started, errors or ())


class HealthService:
    """DRAResourceHealth of one version."""

    def __init__(self, wire: Wire, streams: HealthStreams) -> None:
        self._wire = wire
        self._streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._streams.stream(self._wire, context)


def add_plugin_services(
    server: grpc.Server,
    preparer: ClaimPreparer,
    streams: HealthStreams,
    observer: RequestObserver | None = None,
) -> None:
    for wire in DRA_PLUGIN.values():
        wire.grpc.add_DRAPluginServicer_to_server(DraService(wire, preparer, observer), server)
    for wire in RESOURCE_HEALTH.values():
        wire.grpc.add_DRAResourceHealthServicer_to_server(HealthService(wire, streams), server)


def _ref(claim: Any) -> ClaimRef:
    return ClaimRef(claim.namespace, claim.name, claim.uid)
