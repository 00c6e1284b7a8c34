"""The supervisor through its seams: hand-written fake servers, registrar, watcher, node facts, health
and observer around the simulated NVML node (no gRPC, no subprocess, no kubelet)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import ReplicatedResource
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.gpus.resources import Resource
from nvdp.node.health.types import HealthSettings
from nvdp.node.nvml import open_nvml
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import PreferredAllocator
from nvdp.plugins.deviceplugin.supervisor import DaemonSettings, InitError, Supervisor
from nvdp.plugins.kubeletplugin.rescan import LayoutRescanner
from testkit import wait_until
from tests.fakes import CONTROL_DEVICES as CONTROLS
from tests.fakes import BrokenNvml, FakeFacts, FakeHealth, FakeKubelet, FakeServer

GPU = "nvidia.com/gpu"


class FakeWatcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.timeouts: list[float | None] = []
        self._woken = threading.Event()
        self.closed = False

    def wait(self, timeout: float | None) -> bool:
        self.timeouts.append(timeout)
        self._woken.wait(timeout)
        self._woken.clear()
        return True

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        self.closed = True


class FakeObserver:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def rpc_done(self, resource: str, method: str, code: Any, seconds: float) -> None:
        pass

    def registered(self, resource: str, first: bool) -> None:
        self.events.append(("registered", (resource, first)))

    def servers_changed(self, servers: Mapping[str, FakeServer]) -> None:
        self.events.append(("servers_changed", sorted(servers)))

    def kubelet_lost(self) -> None:
        self.events.append(("kubelet_lost", None))

    def reloaded(self, ok: bool) -> None:
        self.events.append(("reloaded", ok))

    def of(self, kind: str) -> list[Any]:
        return [value for k, value in list(self.events) if k == kind]


class Rig:
    """A supervisor on a thread with every seam faked; `reloads` feeds its reload() source."""

    def __init__(
        self,
        tmp_path: Path,
        settings: DaemonSettings,
        nvml: Any = None,
        server_type: type[FakeServer] = FakeServer,
    ) -> None:
        self.kubelet = FakeKubelet()
        self.facts = FakeFacts()
        self.health = FakeHealth()
        self.observer = FakeObserver()
        self.watchers: list[FakeWatcher] = []
        self.reloads: list[DaemonSettings | Exception] = []
        self.made: list[FakeServer] = []
        self.error: BaseException | None = None
        self.nvml = nvml if nvml is not None else open_nvml("sim:pcie-4")

        def make_server(
            resource: Resource,
            socket_path: Path,
            options: ResponseOptions,
            allocator: PreferredAllocator | None,
        ) -> FakeServer:
            server = server_type(resource, socket_path, options, allocator)
            self.made.append(server)
            return server

        def watcher(directory: Path) -> FakeWatcher:
            self.watchers.append(FakeWatcher(directory))
            return self.watchers[-1]

        self.supervisor: Supervisor[FakeServer] = Supervisor(
            self.nvml,
            settings,
            reload=self._reload,
            make_server=make_server,
            host_facts=self.facts,
            register=self.kubelet.register,
            watcher=watcher,
            socket_id=lambda path: self.kubelet.socket_id,
            health=self.health,
            observer=self.observer,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _reload(self) -> DaemonSettings:
        found = self.reloads.pop(0)
        if isinstance(found, Exception):
            raise found
        return found

    def _run(self) -> None:
        try:
            self.supervisor.run()
        except BaseException as error:
            self.error = error

    def start(self) -> Rig:
        self._thread.start()
        return self

    def poke(self) -> None:
        """What inotify does when the kubelet's directory changes."""
        wait_until(lambda: self.watchers, 5, "the watcher")
        self.watchers[0].wake()

    def reload(self, found: DaemonSettings | Exception) -> None:
        self.reloads.append(found)
        self.supervisor.request_reload()

    def stop(self) -> None:
        self.supervisor.request_stop()
        self._thread.join(5)
        assert not self._thread.is_alive()


@pytest.fixture
def settings(tmp_path: Path) -> DaemonSettings:
    return DaemonSettings(
        kubelet_socket=tmp_path / "kubelet.sock",
        container_driver_root="/driver-root",
        response=ResponseOptions(dev_root="/host"),
    )


@pytest.fixture
def rig(tmp_path: Path, settings: DaemonSettings) -> Iterator[Rig]:
    rig = Rig(tmp_path, settings)
    yield rig
    rig.stop()


def test_serves_and_registers_every_resource_once(rig: Rig, tmp_path: Path) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    (server,) = rig.supervisor.servers.values()
    assert (server.resource_name, len(server.devices), server.started) == (GPU, 4, True)
    assert server.socket_path == tmp_path / "nvidia-gpu.sock"
    assert server.options.control_devices == CONTROLS  # node facts reach the responses as data
    assert rig.facts.asked == [("/host", "/driver-root")]
    assert rig.facts.minors_asked == 0  # no MIG GPU on pcie-4: procfs is not read
    assert rig.kubelet.calls == [(GPU, "nvidia-gpu.sock", False)]
    assert rig.health.started == [(4, None)] and rig.health.targets == [[server]]
    assert rig.observer.events == [("servers_changed", [GPU]), ("registered", (GPU, True))]


def test_empty_kubelet_socket_serves_without_registering(tmp_path: Path, settings: DaemonSettings) -> None:
    rig = Rig(tmp_path, replace(settings, register_with_kubelet=False))
    rig.kubelet.socket_id = None  # no kubelet at all
    rig.start()
    try:
        assert rig.supervisor.ready.wait(5)
        (server,) = rig.supervisor.servers.values()
        assert server.started and server.socket_path == tmp_path / "nvidia-gpu.sock"
        assert rig.supervisor.registrations() == {GPU: True}
        server.wiped = True  # e.g. a kubelet restart removed our socket: served again
        rig.poke()
        wait_until(lambda: rig.supervisor.servers[GPU] is not server, 5, "the server restarted")
        assert rig.supervisor.servers[GPU].started and rig.supervisor.ready.is_set()
        assert rig.kubelet.calls == [] and rig.observer.of("registered") == []
    finally:
        rig.stop()


def test_kubelet_restart_replaces_wiped_servers_and_registers_again(rig: Rig) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    (old,) = rig.supervisor.servers.values()
    old.wiped = True  # the restarting kubelet removed our socket
    rig.kubelet.socket_id = (2, 2)
    rig.poke()
    wait_until(lambda: rig.kubelet.registered() == [GPU, GPU], 5, "re-registration")
    (new,) = rig.supervisor.servers.values()
    assert new is not old and old.stopped and new.started
    assert (new.resource, new.socket_path, new.options) == (old.resource, old.socket_path, old.options)
    assert rig.health.targets[-1] == [new]
    assert rig.observer.of("servers_changed") == [[GPU], [GPU]]
    assert rig.observer.of("registered") == [(GPU, True), (GPU, False)]


def test_kubelet_gone_then_back(rig: Rig) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    rig.kubelet.socket_id = None
    rig.poke()
    wait_until(lambda: rig.observer.of("kubelet_lost"), 5, "kubelet_lost")
    assert not rig.supervisor.ready.is_set()
    rig.kubelet.socket_id = (3, 3)
    rig.poke()
    wait_until(lambda: rig.supervisor.ready.is_set(), 5, "ready again")
    assert rig.kubelet.registered() == [GPU, GPU]
    assert len(rig.made) == 1  # the server itself was fine: not restarted


def test_refused_registration_is_retried_with_backoff(rig: Rig) -> None:
    rig.kubelet.refuse = 2
    rig.start()
    assert rig.supervisor.ready.wait(5)
    assert rig.kubelet.registered() == [GPU]
    assert rig.watchers[0].timeouts[:2] == [0.1, 0.2]


def test_reload_converges_by_diff(rig: Rig, settings: DaemonSettings) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    (before,) = rig.supervisor.servers.values()
    shared = replace(
        settings,
        rules=ResourceRules(sharing=(ReplicatedResource(name=GPU, replicas=2, rename=None),)),
        health=HealthSettings(probe_interval=1.0),
    )
    rig.reload(shared)
    wait_until(lambda: rig.observer.of("reloaded") == [True], 5, "the reload")
    (after,) = rig.supervisor.servers.values()
    # A changed device list goes to the running server: same stream, no re-registration.
    assert after is before and not before.stopped and len(after.devices) == 8
    assert rig.health.started[-1] == (4, HealthSettings(probe_interval=1.0))
    assert rig.supervisor.settings == shared
    assert rig.kubelet.registered() == [GPU]

    rig.reload(shared)  # same settings: nothing restarts
    wait_until(lambda: rig.observer.of("reloaded") == [True, True], 5, "the second reload")
    assert rig.supervisor.servers[GPU] is after and not after.stopped


def test_failed_reload_keeps_the_previous_configuration(rig: Rig, settings: DaemonSettings) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    (server,) = rig.supervisor.servers.values()
    rig.reload(ConfigError(["config.yaml: not YAML"]))
    wait_until(lambda: rig.observer.of("reloaded") == [False], 5, "the failed reload")
    assert rig.supervisor.servers == {GPU: server} and not server.stopped
    assert rig.supervisor.settings == settings


def test_kubelet_socket_changes_wait_for_a_restart(
    rig: Rig, settings: DaemonSettings, tmp_path: Path
) -> None:
    rig.start()
    assert rig.supervisor.ready.wait(5)
    rig.reload(replace(settings, kubelet_socket=tmp_path / "elsewhere" / "kubelet.sock"))
    wait_until(lambda: rig.observer.of("reloaded") == [True], 5, "the reload")
    assert rig.supervisor.settings.kubelet_socket == settings.kubelet_socket


def test_nvml_failure_with_fail_on_init_error_ends_run(tmp_path: Path, settings: DaemonSettings) -> None:
    rig = Rig(tmp_path, settings, nvml=BrokenNvml()).start()
    rig.stop()
    assert isinstance(rig.error, InitError)
    assert str(rig.error).startswith("failed to initialize NVML: nvmlInit_v2 failed")
    assert rig.health.stopped and rig.watchers[0].closed


def test_nvml_failure_without_fail_on_init_error_idles_ready(
    tmp_path: Path, settings: DaemonSettings
) -> None:
    rig = Rig(tmp_path, replace(settings, fail_on_init_error=False), nvml=BrokenNvml()).start()
    try:
        assert rig.supervisor.ready.wait(5)
        assert rig.observer.events == [("servers_changed", [])]
        assert rig.made == [] and rig.kubelet.calls == []
    finally:
        rig.stop()
    assert rig.error is None


def test_rescan_applies_a_new_mig_layout_with_the_current_settings(
    tmp_path: Path, settings: DaemonSettings
) -> None:
    rig = Rig(
        tmp_path,
        replace(settings, rules=ResourceRules(mig_strategy="mixed")),
        nvml=open_nvml("sim:dgx-a100-mig"),
    )
    assert rig.supervisor.served_gpus() is None  # nothing enumerated yet: no rescan compares
    rig.start()
    try:
        assert rig.supervisor.ready.wait(5)
        before = dict(rig.supervisor.servers)
        served = rig.supervisor.served_gpus()
        assert served is not None and served[3].mig_devices[0].profile == "7g.40gb"
        rig.nvml.inject({"uuid": served[3].uuid, "mig": ["4g.20gb", "3g.20gb"]})
        rig.supervisor.request_rescan()
        wait_until(lambda: "nvidia.com/mig-4g.20gb" in rig.supervisor.servers, 5, "the new profile")
        servers = rig.supervisor.servers
        assert "nvidia.com/mig-7g.40gb" not in servers and before["nvidia.com/mig-7g.40gb"].stopped
        assert servers["nvidia.com/mig-3g.20gb"] is before["nvidia.com/mig-3g.20gb"]  # updated in place
        assert len(servers["nvidia.com/mig-3g.20gb"].devices) == 2
        assert all(servers[n] is before[n] and not before[n].stopped for n in (GPU, "nvidia.com/mig-1g.5gb"))
        assert rig.observer.of("reloaded") == []  # not a config reload
    finally:
        rig.stop()


def test_rescan_serves_the_new_uuids_of_a_layout_created_again(
    tmp_path: Path, settings: DaemonSettings
) -> None:
    """The same profiles destroyed and created again: new MIG device UUIDs, which the served IDs follow."""
    rig = Rig(
        tmp_path,
        replace(settings, rules=ResourceRules(mig_strategy="mixed")),
        nvml=open_nvml("sim:dgx-a100-mig"),
    ).start()
    try:
        assert rig.supervisor.ready.wait(5)
        scan = LayoutRescanner(rig.nvml.mig_layout, rig.supervisor.served_gpus, rig.supervisor.request_rescan)
        assert scan.check() == []
        server = rig.supervisor.servers["nvidia.com/mig-7g.40gb"]
        old_ids = set(server.devices)
        gpu = rig.supervisor.served_gpus()[3]  # type: ignore[index]
        rig.nvml.inject({"uuid": gpu.uuid, "mig": ["7g.40gb"]})
        assert [(c.kind, c.gpu.uuid) for c in scan.check()] == [("mig", gpu.uuid)]
        new_uuid = rig.nvml.mig_layout()[gpu.uuid].mig_uuids[0]
        assert new_uuid not in old_ids
        wait_until(lambda: new_uuid in set(server.devices), 5, "the new MIG uuid served")
        assert old_ids - set(server.devices) == {gpu.mig_devices[0].uuid}
        assert rig.supervisor.servers["nvidia.com/mig-7g.40gb"] is server  # same resource, new list
        assert scan.check() == []
    finally:
        rig.stop()
