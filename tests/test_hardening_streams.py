"""ListAndWatch streams: served independently, none ended by another client's arrival, the excess
refused with RESOURCE_EXHAUSTED (one place always kept for the kubelet), unary RPCs never starved; and
when the kubelet's own stream ends the resource registers again, /readyz failing in between (issues 9
and 17)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api import pb, pb_grpc
from nvdp.base.logs import TextFormatter
from nvdp.node.gpus.resources import build_resources
from nvdp.node.nvml.sim import open_sim
from nvdp.plugins.deviceplugin.daemon import GRPC_WORKERS
from nvdp.plugins.deviceplugin.probe import PROBE_TIMEOUT_S, rpc_problem
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import MAX_LIST_AND_WATCH_STREAMS, DevicePluginServer
from nvdp.plugins.metrics import Probes
from nvdp.sim.kubelet import Kubelet
from testkit import Process, free_port, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.readings import http_get

GPU = "nvidia.com/gpu"
# docs/hardening.md: 16 streams per server, one place kept for the kubelet; other clients share 15.
STREAMS = 16
OTHERS = STREAMS - 1


class RpcRecorder:
    """The server's RpcObserver (metrics in the daemon): (method, code) of every reported call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, grpc.StatusCode]] = []

    def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.calls.append((method, code))


@pytest.fixture
def rpcs() -> RpcRecorder:
    return RpcRecorder()


@pytest.fixture
def server(sock_dir: Path, rpcs: RpcRecorder) -> Iterator[DevicePluginServer]:
    nvml = open_sim("pcie-4")
    nvml.init()
    (resource,) = build_resources(nvml.gpus()).resources
    nvml.shutdown()
    executor = ThreadPoolExecutor(max_workers=GRPC_WORKERS)
    plugin = DevicePluginServer(
        resource, sock_dir / resource.socket_name, ResponseOptions(), executor, observer=rpcs
    )
    plugin.start()
    yield plugin
    plugin.stop(grace=0.0)
    executor.shutdown(wait=False, cancel_futures=True)


class Streams:
    """ListAndWatch streams opened by separate clients (one channel each, as separate processes)."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.channels: list[grpc.Channel] = []
        self.open: list[Any] = []

    def add(self) -> Any:
        """Open one stream and read its first list (so it is served); return the stream."""
        channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        self.channels.append(channel)
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=30)
        next(stream)
        self.open.append(stream)
        return stream

    def close(self) -> None:
        for stream in self.open:
            stream.cancel()
        for channel in self.channels:
            channel.close()


def unhealthy(response: pb.ListAndWatchResponse) -> set[str]:
    return {d.ID for d in response.devices if d.health != "Healthy"}


def refused(streams: Streams) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        streams.add()
    return caught.value


# ---- the server, in process ---------------------------------------------------------------------


def test_the_bound_is_the_documented_one() -> None:
    assert MAX_LIST_AND_WATCH_STREAMS == STREAMS


def test_unary_rpcs_answer_with_many_unread_streams(server: DevicePluginServer) -> None:
    channels = [grpc.insecure_channel(f"unix://{server.socket_path}") for _ in range(GRPC_WORKERS + 8)]
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
        assert server.open_streams <= STREAMS
        for stream in streams:
            stream.cancel()
    finally:
        for c in channels:
            c.close()


def test_every_stream_gets_every_update_and_the_excess_is_refused(
    server: DevicePluginServer, rpcs: RpcRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    streams = Streams(server.socket_path)
    lost: list[str] = []
    try:
        server.expect_kubelet_stream(lambda: lost.append("kubelet"))
        kubelet = streams.add()
        for _ in range(OTHERS):
            streams.add()
        error = refused(streams)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.details() == (
            f"{GPU}: at most {STREAMS} ListAndWatch streams (one kept for the "
            "kubelet); close another stream first"
        )
        for _ in range(2):  # a client retrying
            assert refused(streams).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.open_streams == STREAMS
        assert rpcs.calls == [("ListAndWatch", grpc.StatusCode.RESOURCE_EXHAUSTED)] * 3  # metrics count them
        lines = [TextFormatter().format(r) for r in caplog.records if "refused" in r.getMessage()]
        assert [line.split(" ", 1)[1] for line in lines] == [
            f"WARNING ListAndWatch refused: too many streams resource={GPU} limit=16 refused=1"
        ]
        device = sorted(server.devices)[1]
        server.set_health([device], False)
        for stream in streams.open:  # the kubelet's and every other one: nothing was ended
            assert unhealthy(next(stream)) == {device}
        assert kubelet.is_active() and lost == []
    finally:
        streams.close()


def test_the_kubelets_next_stream_gets_in_when_others_fill_the_bound(server: DevicePluginServer) -> None:
    """The kubelet's stream after a registration is admitted whatever other clients hold; the one
    place kept for it is not a place for anyone else."""
    streams = Streams(server.socket_path)
    try:
        server.expect_kubelet_stream(lambda: None)
        first = streams.add()
        for _ in range(OTHERS):
            streams.add()
        first.cancel()  # the kubelet drops its stream; the others stay
        wait_until(lambda: server.open_streams == OTHERS, timeout=5, what="the kubelet's stream gone")
        assert refused(streams).code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # not the kubelet's place
        server.expect_kubelet_stream(lambda: None)  # registered again
        second = streams.add()
        assert refused(streams).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        server.set_health([sorted(server.devices)[0]], False)
        assert unhealthy(next(second)) == {sorted(server.devices)[0]}
    finally:
        streams.close()


def test_only_the_current_kubelet_stream_ending_is_reported(server: DevicePluginServer) -> None:
    streams = Streams(server.socket_path)
    lost: list[str] = []
    try:
        other = streams.add()  # opened before any registration: not the kubelet's
        server.expect_kubelet_stream(lambda: lost.append("first"))
        first = streams.add()
        server.expect_kubelet_stream(lambda: lost.append("second"))  # registered again
        second = streams.add()
        other.cancel()
        first.cancel()  # the earlier registration's stream: the kubelet closes it on re-registration
        wait_until(lambda: server.open_streams == 1, timeout=5, what="two streams ended")
        assert lost == []
        second.cancel()
        wait_until(lambda: lost, timeout=5, what="the kubelet's stream end reported")
        assert lost == ["second"]
        server.expect_kubelet_stream(lambda: lost.append("third"))
        streams.add()
        server.stop(grace=0.0)  # our own stop ends it: not a kubelet that dropped us
        wait_until(lambda: server.open_streams == 0, timeout=5, what="streams ended by stop")
        assert lost == ["second"]
    finally:
        streams.close()


# ---- a real plugin process and the kubelet stand-in ---------------------------------------------


class PluginWithStreams:
    """`nvdp plugin` (sim:pcie-4, metrics on) registered with a kubelet stand-in."""

    def __init__(self, sock_dir: Path, tmp_path: Path, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.events = tmp_path / "events.jsonl"
        self.events.touch()
        self.port = free_port()
        self.plugin: Process = start_plugin(
            sock_dir,
            "sim:pcie-4",
            metrics_address=f"127.0.0.1:{self.port}",
            env={"NVDP_SIM_EVENTS": str(self.events)},
        )
        self.gpus = [g.uuid for g in sim_gpus("pcie-4")]
        self.streams = Streams(sock_dir / "nvidia-gpu.sock")

    def inject(self, **line: object) -> None:
        append_sim_event(self.events, **line)

    def readyz(self) -> tuple[int, str]:
        return http_get(self.port, "/readyz")

    def wait_ready(self) -> None:
        wait_until(lambda: self.readyz()[0] == 200, timeout=20, what="/readyz 200")

    def close(self) -> None:
        self.streams.close()
        self.plugin.stop()


@pytest.fixture
def node(sock_dir: Path, tmp_path: Path) -> Iterator[PluginWithStreams]:
    # One Registration worker and a short dial timeout: a test can keep the kubelet busy for 2 s.
    with Kubelet(sock_dir, workers=1, dial_timeout=2.0) as kubelet:
        node = PluginWithStreams(sock_dir, tmp_path, kubelet)
        try:
            kubelet.wait_for_registration(GPU, timeout=20)
            kubelet.wait_for_devices(GPU, lambda d: len(d) == 4, timeout=10)
            yield node
        finally:
            node.close()
            print(node.plugin.log()[-8000:])


def test_other_clients_streams_never_cut_the_kubelet_off(node: PluginWithStreams) -> None:
    """A debugging grpcurl and a monitoring agent (and more, up to the bound) beside the kubelet:
    the kubelet's stream stays and gets a later XID, Allocate answers, the excess stream is refused."""
    node.wait_ready()
    for _ in range(OTHERS):
        node.streams.add()
    started = time.monotonic()
    response = node.kubelet.allocate(GPU, [[node.gpus[0]]])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == node.gpus[0]
    assert time.monotonic() - started < 1.0
    node.inject(uuid=node.gpus[2], xid=79)
    node.kubelet.wait_for_devices(GPU, lambda d: d[node.gpus[2]].health == "Unhealthy", timeout=10)
    assert node.kubelet.stream_ends(GPU) == [], "the kubelet's stream was ended"
    assert len(node.kubelet.registrations) == 1
    for stream in node.streams.open:
        assert unhealthy(next(stream)) == {node.gpus[2]}
    error = refused(node.streams)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert node.kubelet.stream_ends(GPU) == [] and all(s.is_active() for s in node.streams.open)
    assert node.readyz() == (200, "ok\n")
    wait_until(
        lambda: (
            "ListAndWatch refused: too many streams resource=nvidia.com/gpu limit=16 refused=1"
            in node.plugin.log()
        ),
        timeout=5,
        what="the refusal line",
    )


class SilentPlugin:
    """A socket in the plugin directory that accepts and never answers: registering it keeps the
    kubelet's one Registration worker dialing it for the dial timeout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(str(path))
        self._socket.listen(8)
        self._accepted: list[socket.socket] = []

    def wait_dialed(self, timeout: float) -> None:
        """Return once the kubelet has connected (it then waits for an answer that never comes)."""
        self._socket.settimeout(timeout)
        self._accepted.append(self._socket.accept()[0])

    def register(self, kubelet_socket: Path) -> threading.Thread:
        def call() -> None:
            request = pb.RegisterRequest(
                version="v1beta1", endpoint=self.path.name, resource_name="example.com/silent"
            )
            with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
                try:
                    pb_grpc.RegistrationStub(channel).Register(request, timeout=10)
                except grpc.RpcError:
                    pass  # refused once the dial times out: expected

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        for connection in self._accepted:
            connection.close()
        self._socket.close()


def test_the_kubelet_dropping_its_stream_leads_to_a_new_registration(
    node: PluginWithStreams, sock_dir: Path
) -> None:
    """The kubelet ends its stream while it stays (it then drops the resource): nvdp registers again,
    /readyz says so meanwhile, and the new stream gets in although other clients fill the bound."""
    node.wait_ready()
    for _ in range(OTHERS):
        node.streams.add()
    silent = SilentPlugin(sock_dir / "silent.sock")
    try:
        busy = silent.register(node.kubelet.socket_path)
        silent.wait_dialed(timeout=5)
        endpoint = node.kubelet.device_state.endpoint(GPU)
        assert endpoint is not None
        endpoint.close()  # the kubelet drops its stream: from now on it knows no nvidia.com/gpu
        wait_until(lambda: node.readyz() == (503, f"not registered: {GPU}\n"), timeout=5, what="/readyz 503")
        busy.join(10)
    finally:
        silent.close()
    node.kubelet.wait_for_registration(GPU, count=2, timeout=15)
    node.kubelet.wait_for_devices(GPU, lambda d: len(d) == 4, timeout=10)
    node.wait_ready()
    node.inject(uuid=node.gpus[1], xid=48)
    node.kubelet.wait_for_devices(GPU, lambda d: d[node.gpus[1]].health == "Unhealthy", timeout=10)
    assert len(node.streams.open) == OTHERS and all(s.is_active() for s in node.streams.open)
    log = node.plugin.log()
    assert (
        f"kubelet dropped the resource (its ListAndWatch stream ended); registering again resource={GPU}"
        in log
    )
    assert f"re-registered with kubelet resource={GPU}" in log


def test_after_a_kubelet_restart_the_kubelet_gets_in_with_others_at_the_bound(
    node: PluginWithStreams,
) -> None:
    """A kubelet restart wipes the plugin sockets: the server restarts (other clients' streams end
    with the old one) and the restarted kubelet's stream is served; other clients reconnect after."""
    node.wait_ready()
    for _ in range(OTHERS):
        node.streams.add()
    node.kubelet.restart()
    node.kubelet.wait_for_registration(GPU, count=2, timeout=15)
    node.kubelet.wait_for_devices(GPU, lambda d: len(d) == 4, timeout=10)
    for stream in node.streams.open:  # ended with the old server (cleanly, or cut mid-send)
        with pytest.raises((StopIteration, grpc.RpcError)):
            next(stream)
    node.streams.close()
    node.streams.open.clear()
    for _ in range(OTHERS):
        node.streams.add()
    node.inject(uuid=node.gpus[3], xid=79)
    node.kubelet.wait_for_devices(GPU, lambda d: d[node.gpus[3]].health == "Unhealthy", timeout=10)
    assert refused(node.streams).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    node.wait_ready()


# ---- /readyz proves the servers answer ------------------------------------------------------


class Supervisor:
    started = True

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

        supervisor = Supervisor({server.resource_name: server, "nvidia.com/silent": silent})
        probes = Probes(supervisor, rpc_probe=probe)  # type: ignore[arg-type]
        started = time.monotonic()
        assert probes.readiness_problem() == (
            "not answering: nvidia.com/silent (GetDevicePluginOptions: DEADLINE_EXCEEDED)"
        )
        assert time.monotonic() - started < PROBE_TIMEOUT_S + 0.5
        assert probes.readiness_problem() is not None and len(calls) == 2, "cached: no new RPC"
        del supervisor.servers["nvidia.com/silent"]
        assert probes.readiness_problem() is None
    finally:
        silent.close()
