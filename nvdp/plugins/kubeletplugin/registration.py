"""Registering with the kubelet, both ways it knows:

- a device plugin calls the kubelet's Registration.Register (`register`), once per resource;
- a DRA plugin serves pluginregistration's Registration on a socket in the kubelet's
  plugins_registry, which the kubelet's plugin watcher finds and asks (`RegistrationService`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from nvdp.api import API_VERSION, pb, pb_grpc
from nvdp.base.backoff import Backoff
from nvdp.base.dir_watch import FileId, file_id
from nvdp.base.errors import RegistrationError
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

# Between two tries of a Register the kubelet answered UNAVAILABLE (it was going away).
RETRY_UNAVAILABLE_S = 0.005


def register(
    kubelet_socket: Path,
    resource_name: str,
    endpoint: str,
    *,
    preferred_allocation: bool = True,
    timeout: float = 10.0,
) -> FileId:
    """Call Registration.Register; waits up to `timeout` for the kubelet to accept connections.

    Returns the identity of the kubelet socket that accepted: the supervisor compares it with the
    current one to notice a later kubelet restart (and not mistake this one's socket swap for it).
    """
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=preferred_allocation),
    )
    deadline = time.monotonic() + timeout
    while True:
        accepted = _wait_until_accepting(kubelet_socket, deadline, resource_name)
        # A fresh channel per try, and no wait_for_ready: a kubelet that dies between the dial and
        # the call (its restart wipes the directory) fails the call at once, and the next try dials
        # the new kubelet's socket; gRPC's own reconnect would wait out its backoff (1 s and more).
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            try:
                pb_grpc.RegistrationStub(channel).Register(
                    request, timeout=max(0.001, deadline - time.monotonic())
                )
                return accepted
            except grpc.RpcError as error:
                code = error.code() if hasattr(error, "code") else None
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                    time.sleep(RETRY_UNAVAILABLE_S)
                    continue
                details = error.details() if hasattr(error, "details") else str(error)
                name = code.name if code is not None else "UNKNOWN"
                raise RegistrationError(
                    f"registering {resource_name} with the kubelet at {kubelet_socket} failed: "
                    f"{name}: {details}"
                ) from error


def _wait_until_accepting(path: Path, deadline: float, resource_name: str) -> FileId:
    """Dial the kubelet's socket every few milliseconds until it accepts a connection.

    A restarting kubelet creates its socket file before it listens; gRPC's own reconnect backoff
    (at least 100 ms in grpc core, whatever the channel options say) would add that much, a plain
    connect() loop adds at most ~2 ms.
    """
    waits = Backoff(0.0005, 0.002)
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            accepted = file_id(path)
            if accepted is not None:
                return accepted
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RegistrationError(
                    f"registering {resource_name} with the kubelet at {path} failed: "
                    f"not accepting connections: {error.strerror}"
                ) from error
        finally:
            probe.close()
        time.sleep(waits.next())


class RegistrationService:
    """pluginregistration.Registration for the kubelet's plugin watcher: GetInfo names the plugin
    (`plugin_type`, `name`, its service `endpoint`, the `versions` it serves, newest first);
    `on_info()` is told each GetInfo (a registration begins), `on_registered(first)` each registration
    the kubelet reports."""

    def __init__(
        self,
        plugin_type: str,
        name: str,
        endpoint: Path,
        versions: Sequence[str],
        *,
        on_registered: Callable[[bool], None] | None = None,
        on_info: Callable[[], None] | None = None,
    ) -> None:
        from nvdp.api.dra import registration  # the plugin-watcher wire: not loaded by the device plugin

        self._wire = registration
        self.plugin_type = plugin_type
        self.name = name
        self.endpoint = endpoint
        self.versions = tuple(versions)
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
        return self._wire.pb.PluginInfo(
            type=self.plugin_type,
            name=self.name,
            endpoint=str(self.endpoint),
            supported_versions=list(self.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.last_status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log_event(
                log,
                logging.INFO,
                "registered with the kubelet",
                driver=self.name,
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
                driver=self.name,
                error=request.error,
            )
        return self._wire.pb.RegistrationStatusResponse()

    def add_to(self, server: grpc.Server) -> None:
        self._wire.grpc.add_RegistrationServicer_to_server(self, server)
