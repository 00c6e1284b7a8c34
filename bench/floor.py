"""The performance floor: the cheapest DevicePlugin a Python grpcio plugin can be.

It answers Allocate with one env var per container and no validation, GetPreferredAllocation with the
first N available IDs, and ListAndWatch with one fixed list. Whatever our plugin costs above these
numbers is our own code; whatever it costs below them is not possible with grpcio.

Run alone: `python -m bench.floor [--calls N]` prints Allocate and GetPreferredAllocation p50/p99 as
the kubelet stand-in sees them. `rows()` returns them for bench/run.py.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from nvdp.api import API_VERSION, HEALTHY, pb, pb_grpc
from nvdp.sim.kubelet import Kubelet

RESOURCE = "example.com/floor"
_OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)


class _FloorServicer:
    def __init__(self, devices: int) -> None:
        self.ids = [f"FLOOR-{i}" for i in range(devices)]
        self._list = pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in self.ids])
        self._lock = threading.Lock()
        self._stopping = False
        self._streams: list[threading.Event] = []

    def stop_streams(self) -> None:
        with self._lock:
            self._stopping = True
            for ended in self._streams:
                ended.set()

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return _OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        yield self._list
        ended = threading.Event()
        context.add_callback(ended.set)
        with self._lock:
            if self._stopping:
                return
            self._streams.append(ended)
        ended.wait()

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(c.devices_ids)})
                for c in request.container_requests
            ]
        )

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=c.available_deviceIDs[: c.allocation_size])
                for c in request.container_requests
            ]
        )

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class FloorPlugin:
    """A running floor plugin; `stop()` ends its streams and its server (idempotent)."""

    def __init__(self, socket_path: Path, devices: int, workers: int) -> None:
        self.socket_path = socket_path
        self._servicer = _FloorServicer(devices)
        self.ids = self._servicer.ids
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="floor-plugin")
        self._server = grpc.server(self._executor)
        pb_grpc.add_DevicePluginServicer_to_server(self._servicer, self._server)
        self._server.add_insecure_port(f"unix:{socket_path}")
        self._server.start()

    def register(self, kubelet_socket: Path, resource: str = RESOURCE) -> None:
        with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
            request = pb.RegisterRequest(
                version=API_VERSION, endpoint=self.socket_path.name, resource_name=resource, options=_OPTIONS
            )
            pb_grpc.RegistrationStub(channel).Register(request, timeout=10)

    def stop(self) -> None:
        self._servicer.stop_streams()
        self._server.stop(None).wait()
        self._executor.shutdown(wait=True)


def start_floor_plugin(socket_path: Path, devices: int = 8, workers: int = 4) -> FloorPlugin:
    """Serve the floor plugin on `socket_path` (not registered yet: call `register`)."""
    return FloorPlugin(Path(socket_path), devices, workers)


@dataclass(frozen=True)
class RpcRow:
    case: str
    calls: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def time_calls(case: str, call: Callable[[], object], calls: int, warmup: int = 200) -> RpcRow:
    """Time `call` `calls` times after `warmup` untimed calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return RpcRow(case, calls, statistics.median(times), p99, times[-1])


def rows(calls: int = 2000) -> list[dict[str, object]]:
    """Floor plugin RPC times through the kubelet stand-in, as dicts with "table": "grpc floor"."""
    with tempfile.TemporaryDirectory(prefix="nvdp-", dir="/tmp") as tmp, Kubelet(tmp) as kubelet:
        plugin = start_floor_plugin(Path(tmp) / "floor.sock")
        try:
            plugin.register(kubelet.socket_path)
            kubelet.wait_for_devices(RESOURCE)
            ids = plugin.ids
            results = [
                time_calls(
                    "Allocate 1 container x 1 device", lambda: kubelet.allocate(RESOURCE, [ids[:1]]), calls
                ),
                time_calls(
                    "Allocate 1 container x 8 devices", lambda: kubelet.allocate(RESOURCE, [ids]), calls
                ),
                time_calls(
                    "GetPreferredAllocation 2 of 8",
                    lambda: kubelet.preferred_allocation(RESOURCE, ids, [], 2),
                    calls,
                ),
            ]
        finally:
            plugin.stop()
    return [{"table": "grpc floor", **asdict(r)} for r in results]


def format_table(all_rows: list[dict[str, object]]) -> str:
    lines = ["== grpc floor (bare grpcio plugin, via the kubelet stand-in)"]
    lines.append(f"{'case':<42} {'calls':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in all_rows:
        lines.append(
            f"{r['case']!s:<42} {r['calls']!s:>7} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per case (default 2000)")
    print(format_table(rows(parser.parse_args().calls)))


if __name__ == "__main__":
    main()
