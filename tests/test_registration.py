"""Register reaches a restarted kubelet without waiting out gRPC's reconnect backoff."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from nvdp.api import pb, pb_grpc
from nvdp.plugins.kubeletplugin.registration import register


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:  # noqa: N802
        self.requests.append(request)
        return pb.Empty()


def test_a_kubelet_that_dies_under_the_call_is_followed_to_its_successor(sock_dir: Path) -> None:
    """The old kubelet accepts the dial, then drops the connection and its socket (a restart wipes
    the directory); the new kubelet listens 100 ms later. gRPC's reconnect backoff on the same
    channel is 1 s or more (2.3 s seen on a real cluster); a fresh dial gets there in about 0.1 s."""
    path = sock_dir / "kubelet.sock"
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(path))
    dying.listen(8)
    successor = grpc.server(ThreadPoolExecutor(2))
    service = _Registration()
    pb_grpc.add_RegistrationServicer_to_server(service, successor)

    def restart() -> None:
        for _ in range(2):  # register's own dial, then gRPC's connection, dropped mid-handshake
            connection, _ = dying.accept()
            connection.close()
        dying.close()
        path.unlink()
        time.sleep(0.1)  # the kubelet between its two lives: the scenario, not a wait on a condition
        successor.add_insecure_port(f"unix:{path}")
        successor.start()

    kubelet = threading.Thread(target=restart, daemon=True)
    kubelet.start()
    started = time.monotonic()
    try:
        register(path, "nvidia.com/gpu", "nvidia-gpu.sock", timeout=10.0)
        took = time.monotonic() - started
        assert [r.resource_name for r in service.requests] == ["nvidia.com/gpu"]
        assert took < 0.8, f"registration took {took:.2f}s: it waited out gRPC's reconnect backoff"
    finally:
        kubelet.join(timeout=5)
        successor.stop(None)
