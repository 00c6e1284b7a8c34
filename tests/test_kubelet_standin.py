"""The kubelet stand-in against a small hand-written plugin on real unix sockets."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api import API_VERSION, HEALTHY, UNHEALTHY, pb, pb_grpc
from nvdp.sim.kubelet import (
    CHECKPOINT_FILE,
    DeviceState,
    Kubelet,
    KubeletError,
    PluginNotConnected,
    is_extended_resource_name,
)
from nvdp.sim.kubelet.node_status import NodeStatusMirror

RESOURCE = "example.com/gpu"
TWO_GPUS = {"GPU-0": (HEALTHY, 0), "GPU-1": (HEALTHY, 1)}


class StubPlugin:
    """The smallest DevicePlugin that answers every RPC and records what it was asked."""

    def __init__(self, socket_path: Path, devices: Mapping[str, tuple[str, int]]) -> None:
        self.socket_path = socket_path
        self.options = pb.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )
        self.allocations: list[list[list[str]]] = []
        self.pre_starts: list[list[str]] = []
        self.stream_cancelled = threading.Event()  # a ListAndWatch was cancelled by the kubelet
        self._cond = threading.Condition()
        self._devices = dict(devices)
        self._version = 0
        self._stopping = False
        self._executor = ThreadPoolExecutor(4)
        self._server = grpc.server(self._executor)
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{socket_path}")
        self._server.start()

    def set_devices(self, devices: Mapping[str, tuple[str, int]]) -> None:
        with self._cond:
            self._devices, self._version = dict(devices), self._version + 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._server.stop(2).wait()
        self._executor.shutdown(wait=True)

    def _ended(self) -> None:
        """A ListAndWatch ended (gRPC's callback): cancelled by the kubelet unless we stop. Set here,
        not in the generator: after a send that completes on a cancelled stream gRPC never resumes it."""
        with self._cond:
            if not self._stopping:
                self.stream_cancelled.set()
            self._cond.notify_all()

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        context.add_callback(self._ended)
        sent = -1

        def woken() -> bool:
            return self._stopping or not context.is_active() or self._version != sent

        while True:
            with self._cond:
                self._cond.wait_for(woken)
                if self._stopping or not context.is_active():
                    return
                sent, devices = self._version, dict(self._devices)
            yield pb.ListAndWatchResponse(
                devices=[
                    pb.Device(ID=i, health=h, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n)]))
                    for i, (h, n) in devices.items()
                ]
            )

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        containers = [list(c.devices_ids) for c in request.container_requests]
        for ids in containers:
            for unknown in set(ids) - set(self._devices):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device {unknown}")
        self.allocations.append(containers)
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"STUB_DEVICES": ",".join(c)}) for c in containers
            ]
        )

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        answers = []
        for c in request.container_requests:
            rest = [d for d in c.available_deviceIDs if d not in c.must_include_deviceIDs]
            chosen = [*c.must_include_deviceIDs, *rest][: c.allocation_size]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        self.pre_starts.append(list(request.devices_ids))
        return pb.PreStartContainerResponse()


def register(
    kubelet: Kubelet,
    endpoint: str,
    resource: str = RESOURCE,
    version: str = API_VERSION,
    wait_for_ready: bool = False,
) -> None:
    with grpc.insecure_channel(f"unix:{kubelet.socket_path}") as channel:
        request = pb.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource)
        pb_grpc.RegistrationStub(channel).Register(request, timeout=10, wait_for_ready=wait_for_ready)


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[Kubelet]:
    with Kubelet(sock_dir, dial_timeout=5.0) as k:
        yield k


@pytest.fixture
def make_plugin(sock_dir: Path) -> Iterator[Callable[..., StubPlugin]]:
    plugins: list[StubPlugin] = []

    def make(name: str = "stub.sock", devices: Mapping[str, tuple[str, int]] = TWO_GPUS) -> StubPlugin:
        plugins.append(StubPlugin(sock_dir / name, devices))
        return plugins[-1]

    yield make
    for plugin in plugins:
        plugin.stop()


def test_registration_is_accepted_and_recorded(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    make_plugin()
    before = time.monotonic()
    register(kubelet, "stub.sock")  # the kubelet dials and asks for options before it answers

    [registration] = kubelet.registrations
    assert (registration.resource, registration.endpoint) == (RESOURCE, "stub.sock")
    assert registration.options.get_preferred_allocation_available
    assert registration.options.pre_start_required
    assert before <= registration.time <= time.monotonic()
    assert kubelet.resources() == [RESOURCE]
    assert kubelet.wait_for_registration(RESOURCE) == registration


@pytest.mark.parametrize(
    ("version", "resource", "endpoint", "message"),
    [
        pytest.param(
            "v1alpha1",
            RESOURCE,
            "stub.sock",
            'requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]',
            id="wrong-version",
        ),
        pytest.param(API_VERSION, "gpu", "stub.sock", 'the ResourceName "gpu" is invalid', id="no-domain"),
        pytest.param(
            API_VERSION,
            "kubernetes.io/gpu",
            "stub.sock",
            'the ResourceName "kubernetes.io/gpu" is invalid',
            id="kubernetes-io-namespace",
        ),
        pytest.param(
            API_VERSION,
            RESOURCE,
            "missing.sock",
            "failed to dial device plugin: endpoint 'missing.sock' does not exist in ",
            id="missing-endpoint",
        ),
    ],
)
def test_register_is_refused(
    kubelet: Kubelet,
    make_plugin: Callable[..., StubPlugin],
    version: str,
    resource: str,
    endpoint: str,
    message: str,
) -> None:
    make_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        register(kubelet, endpoint, resource, version)

    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details().startswith(message)
    assert kubelet.rejections[-1].message == refused.value.details()
    assert kubelet.registrations == [] and kubelet.resources() == []


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("example.org/Shared_GPU", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("gpu.kubernetes.io/a100", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),
        ("nvidia.com/", False),
        ("nvidia.com/a/b", False),
        ("nvidia.com/-gpu", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
    ids=lambda v: str(v)[:24],
)
def test_is_extended_resource_name(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


def test_list_and_watch_devices_and_updates(kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]) -> None:
    plugin = make_plugin()
    register(kubelet, "stub.sock")

    assert kubelet.wait_for_devices(RESOURCE) == {
        "GPU-0": DeviceState(HEALTHY, (0,)),
        "GPU-1": DeviceState(HEALTHY, (1,)),
    }
    plugin.set_devices({"GPU-0": (HEALTHY, 0), "GPU-1": (UNHEALTHY, 1)})
    kubelet.wait_for_devices(RESOURCE, lambda devices: devices["GPU-1"].health == UNHEALTHY)

    first, second = kubelet.wait_for_updates(RESOURCE, 2)
    assert first.time <= second.time
    assert second.devices["GPU-1"] == DeviceState(UNHEALTHY, (1,))
    assert not kubelet.stream_closed(RESOURCE)


def test_allocate_preferred_and_pre_start_round_trips(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    plugin = make_plugin()
    register(kubelet, "stub.sock")

    response = kubelet.allocate(RESOURCE, [["GPU-0"], ["GPU-1", "GPU-0"]])
    assert [dict(c.envs) for c in response.container_responses] == [
        {"STUB_DEVICES": "GPU-0"},
        {"STUB_DEVICES": "GPU-1,GPU-0"},
    ]
    assert kubelet.preferred_allocation(RESOURCE, ["GPU-0", "GPU-1", "GPU-2"], ["GPU-2"], 2) == [
        "GPU-2",
        "GPU-0",
    ]
    raw = kubelet.get_preferred_allocation(
        RESOURCE,
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=["a"], allocation_size=1)
            ]
        ),
    )
    assert list(raw.container_responses[0].deviceIDs) == ["a"]
    kubelet.pre_start_container(RESOURCE, ["GPU-1"])
    assert plugin.pre_starts == [["GPU-1"]]
    assert kubelet.options(RESOURCE) == plugin.options

    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(RESOURCE, [["GPU-9"]])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-9" in refused.value.details()
    kubelet.allocate(RESOURCE, [["GPU-1"]])  # the same channel keeps working
    assert len(plugin.allocations) == 2
    assert kubelet.stub(RESOURCE) is kubelet.stub(RESOURCE)


def test_reregistration_replaces_the_old_stream(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    old = make_plugin("old.sock")
    new = make_plugin("new.sock", {"GPU-7": (HEALTHY, 1)})
    register(kubelet, "old.sock")
    kubelet.wait_for_devices(RESOURCE)

    register(kubelet, "new.sock")

    assert old.stream_cancelled.wait(5)
    assert kubelet.wait_for_devices(RESOURCE, lambda devices: "GPU-7" in devices) == {
        "GPU-7": DeviceState(HEALTHY, (1,))
    }
    [end] = kubelet.stream_ends(RESOURCE)
    assert (end.endpoint, end.by_kubelet) == ("old.sock", True)
    kubelet.allocate(RESOURCE, [["GPU-7"]])
    assert (old.allocations, new.allocations) == ([], [[["GPU-7"]]])
    assert [r.endpoint for r in kubelet.registrations] == ["old.sock", "new.sock"]


def test_a_stream_ended_by_the_plugin_disconnects_it(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    plugin = make_plugin()
    register(kubelet, "stub.sock")
    kubelet.wait_for_devices(RESOURCE)

    plugin.stop()
    kubelet.wait_for_stream_closed(RESOURCE)

    [end] = kubelet.stream_ends(RESOURCE)
    assert (end.code, end.by_kubelet) == (grpc.StatusCode.OK, False)
    with pytest.raises(PluginNotConnected):
        kubelet.allocate(RESOURCE, [["GPU-0"]])
    assert set(kubelet.devices(RESOURCE)) == {"GPU-0", "GPU-1"}  # the last list the plugin sent


def test_restart_removes_plugin_sockets_and_recreates_kubelet_sock(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin], sock_dir: Path
) -> None:
    plugin = make_plugin()
    register(kubelet, "stub.sock")
    kubelet.wait_for_devices(RESOURCE)
    (sock_dir / CHECKPOINT_FILE).write_text("{}")
    (sock_dir / "notes.txt").write_text("kept")
    (sock_dir / "subdir").mkdir()

    kubelet.restart()

    assert not (sock_dir / "stub.sock").exists()
    assert sorted(p.name for p in sock_dir.iterdir()) == sorted(
        [CHECKPOINT_FILE, "kubelet.sock", "notes.txt", "subdir"]
    )
    assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
    assert plugin.stream_cancelled.wait(5)
    assert kubelet.stream_ends(RESOURCE)[-1].by_kubelet
    assert (kubelet.resources(), kubelet.devices(RESOURCE)) == ([], {})

    make_plugin()  # the plugin notices and comes back on the same endpoint
    register(kubelet, "stub.sock")
    assert kubelet.wait_for_registration(RESOURCE, count=2).endpoint == "stub.sock"
    assert set(kubelet.wait_for_devices(RESOURCE)) == {"GPU-0", "GPU-1"}


def test_accept_delay_refuses_connections_until_it_serves(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    delay = 0.5
    asked = time.monotonic()
    restart = threading.Thread(target=kubelet.restart, kwargs={"accept_delay": delay})
    restart.start()
    try:
        kubelet.wait_for(lambda: kubelet.state == "refusing", timeout=5, what="refusing kubelet.sock")
        assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
        with socket.socket(socket.AF_UNIX) as raw, pytest.raises(ConnectionRefusedError):
            raw.connect(str(kubelet.socket_path))
        make_plugin()
        with pytest.raises(grpc.RpcError) as refused:
            register(kubelet, "stub.sock")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        register(kubelet, "stub.sock", wait_for_ready=True)  # a plugin that keeps retrying gets in
    finally:
        restart.join(10)
    assert kubelet.serving_since is not None and kubelet.serving_since - asked >= delay
    assert kubelet.wait_for_registration(RESOURCE).time >= kubelet.serving_since


def test_lifecycle_errors(sock_dir: Path) -> None:
    with Kubelet(sock_dir) as k:
        assert k.state == "serving" and k.socket_path.exists()
        with pytest.raises(KubeletError, match="already running"):
            k.start()
    assert (k.state, k.socket_path.exists()) == ("stopped", False)
    with pytest.raises(KubeletError, match="longer than 107 bytes"):
        Kubelet(sock_dir / ("d" * 100)).start()


def _counts() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def test_stop_is_idempotent_and_leaks_no_threads_or_fds(sock_dir: Path) -> None:
    def cycle() -> None:
        kubelet = Kubelet(sock_dir)
        kubelet.stop()  # before start: nothing to do
        kubelet.start()
        plugin = StubPlugin(sock_dir / "stub.sock", TWO_GPUS)
        register(kubelet, "stub.sock")
        kubelet.wait_for_devices(RESOURCE)
        kubelet.allocate(RESOURCE, [["GPU-0"]])
        kubelet.restart()
        plugin.stop()
        plugin = StubPlugin(sock_dir / "stub.sock", TWO_GPUS)
        register(kubelet, "stub.sock")
        kubelet.wait_for_devices(RESOURCE)
        kubelet.stop()
        assert [t.name for t in threading.enumerate() if t.name.startswith("kubelet-")] == []
        kubelet.stop()
        plugin.stop()
        assert not kubelet.socket_path.exists()

    cycle()  # grpc sets up its process-wide threads and fds once
    baseline = _counts()
    for _ in range(5):
        cycle()
    deadline = time.monotonic() + 5
    while (
        any(now > then for now, then in zip(_counts(), baseline, strict=True)) and time.monotonic() < deadline
    ):
        time.sleep(0.02)  # grpc retires its per-channel threads asynchronously
    threads, fds = _counts()
    assert threads <= baseline[0], [t.name for t in threading.enumerate()]
    assert fds <= baseline[1], os.listdir("/proc/self/fd")


def test_the_node_status_counts_devices_and_reaches_the_node_late(
    kubelet: Kubelet, make_plugin: Callable[..., StubPlugin]
) -> None:
    """Capacity: every device; allocatable: the healthy ones, none once the plugin disconnected; the
    mirror writes them `delay` seconds after they changed, as the kubelet's status update."""
    written: list[tuple[float, dict[str, int], dict[str, int]]] = []
    done = threading.Event()

    def write(capacity: dict[str, int], allocatable: dict[str, int]) -> None:
        written.append((time.monotonic(), capacity, allocatable))
        if allocatable == {RESOURCE: 0}:
            done.set()

    with NodeStatusMirror(kubelet, write, 0.3):
        plugin = make_plugin()
        register(kubelet, "stub.sock")
        kubelet.wait_for_devices(RESOURCE)
        plugin.set_devices({"GPU-0": (HEALTHY, 0), "GPU-1": (UNHEALTHY, 1)})
        kubelet.wait_for_devices(RESOURCE, lambda devices: devices["GPU-1"].health == UNHEALTHY)
        assert kubelet.node_counts() == ({RESOURCE: 2}, {RESOURCE: 1})
        changed = time.monotonic()
        plugin.stop()
        kubelet.wait_for_stream_closed(RESOURCE)
        assert kubelet.node_counts() == ({RESOURCE: 2}, {RESOURCE: 0})
        assert done.wait(10)
    assert written[-1][1:] == ({RESOURCE: 2}, {RESOURCE: 0})
    assert written[-1][0] - changed >= 0.3
