"""Issue 9 defect 4: ListAndWatch streams cannot starve unary RPCs. Streams run on a pool of their own,
a server keeps at most MAX_LIST_AND_WATCH_STREAMS (a newer stream from the same peer replaces the
oldest), and Allocate answers however many streams clients open and never read."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api import pb, pb_grpc
from nvdp.daemon import GRPC_WORKERS
from nvdp.metrics import Probes
from nvdp.nvml.sim import open_sim
from nvdp.plugin.probe import PROBE_TIMEOUT_S, rpc_problem
from nvdp.plugin.responses import ResponseOptions
from nvdp.plugin.server import MAX_LIST_AND_WATCH_STREAMS, DevicePluginServer
from nvdp.resources import build_resources
from nvdp.testing import wait_until


@pytest.fixture
def server(sock_dir: Path) -> Iterator[DevicePluginServer]:
    nvml = open_sim("pcie-4")
    nvml.init()
    (resource,) = build_resources(nvml.gpus()).resources
    nvml.shutdown()
    executor = ThreadPoolExecutor(max_workers=GRPC_WORKERS)
    plugin = DevicePluginServer(resource, sock_dir / resource.socket_name, ResponseOptions(), executor)
    plugin.start()
    yield plugin
    plugin.stop(grace=0.0)
    executor.shutdown(wait=False, cancel_futures=True)


def channel(server: DevicePluginServer) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{server.socket_path}")


def test_unary_rpcs_answer_with_many_unread_streams(server: DevicePluginServer) -> None:
    channels = [channel(server) for _ in range(GRPC_WORKERS + 8)]
    try:
        # Clients that open a stream and never read it, more than the whole worker pool.
        streams: list[Any] = [pb_grpc.DevicePluginStub(c).ListAndWatch(pb.Empty()) for c in channels]
        wait_until(lambda: server.open_streams >= 1, timeout=5, what="streams open")
        stub = pb_grpc.DevicePluginStub(channels[0])
        device = next(iter(server.devices))
        started = time.monotonic()
        for _ in range(3):
            assert stub.GetDevicePluginOptions(pb.Empty(), timeout=2.0) is not None
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]
            )
            assert len(stub.Allocate(request, timeout=2.0).container_responses) == 1
        assert time.monotonic() - started < 2.0
        assert server.open_streams <= MAX_LIST_AND_WATCH_STREAMS
        for stream in streams:
            stream.cancel()
    finally:
        for c in channels:
            c.close()


def test_a_newer_stream_replaces_the_oldest(server: DevicePluginServer) -> None:
    channels = [channel(server) for _ in range(MAX_LIST_AND_WATCH_STREAMS + 1)]
    try:
        streams = []
        for c in channels:
            stream = pb_grpc.DevicePluginStub(c).ListAndWatch(pb.Empty())
            assert len(next(stream).devices) == len(server.devices)  # read: the stream is served
            streams.append(stream)
        # The oldest ends: cleanly (OK) or, when caught sending, CANCELLED.
        with pytest.raises((StopIteration, grpc.RpcError)) as ended:
            next(streams[0])
        assert isinstance(ended.value, StopIteration) or ended.value.code() == grpc.StatusCode.CANCELLED
        wait_until(lambda: server.open_streams == MAX_LIST_AND_WATCH_STREAMS, timeout=5, what="replaced")
        server.set_health([next(iter(server.devices))], False)  # the newest streams still get updates
        for stream in streams[1:]:
            assert "Unhealthy" in {d.health for d in next(stream).devices}
    finally:
        for c in channels:
            c.close()


# ---- /readyz proves the servers answer ------------------------------------------------------


class Supervisor:
    def __init__(self, servers: dict[str, Any]) -> None:
        self.servers = servers

    def registrations(self) -> dict[str, bool]:
        return dict.fromkeys(self.servers, True)


class SilentServer:
    """A socket that is bound and listening but never answers (a server whose workers are all held)."""

    def __init__(self, path: Path) -> None:
        self.socket_path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(str(path))
        self._socket.listen(64)

    def close(self) -> None:
        self._socket.close()


def test_readyz_fails_when_a_server_does_not_answer(server: DevicePluginServer, sock_dir: Path) -> None:
    silent = SilentServer(sock_dir / "nvidia-silent.sock")
    try:
        calls: list[Path] = []

        def probe(path: Path) -> str | None:
            calls.append(path)
            return rpc_problem(path)

        probes = Probes()
        probes.registrations = Supervisor({server.resource_name: server, "nvidia.com/silent": silent})  # type: ignore[assignment]
        probes.rpc_probe = probe
        probes.served()
        started = time.monotonic()
        assert probes.readiness_problem() == (
            "not answering: nvidia.com/silent (GetDevicePluginOptions: DEADLINE_EXCEEDED)"
        )
        assert time.monotonic() - started < PROBE_TIMEOUT_S + 0.5
        assert probes.readiness_problem() is not None and len(calls) == 2, "cached: no new RPC"
        probes.registrations = Supervisor({server.resource_name: server})  # type: ignore[assignment]
        assert probes.readiness_problem() is None
    finally:
        silent.close()
