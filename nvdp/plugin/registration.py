"""Registering a plugin server with the kubelet."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import grpc

from nvdp.api import API_VERSION, pb, pb_grpc
from nvdp.backoff import Backoff
from nvdp.dir_watch import FileId, file_id
from nvdp.errors import RegistrationError

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
