"""HealthMonitor against the simulated NVML backend, driven through NVDP_SIM_EVENTS."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.backoff import Backoff
from nvdp.base.logs import TextFormatter
from nvdp.node.health import HealthChange, HealthMonitor, HealthRouter, HealthSettings
from nvdp.node.health.monitor import GPU_LOST_REASON, ROW_REMAP_FAILURE_REASON
from nvdp.node.nvml import GpuInfo, Nvml, open_nvml
from testkit import wait_until
from tests.builders import append_sim_event, replicas
from tests.fakes import FakeTarget

DEADLINE = 10.0  # generous: a loaded 2-core CI machine


class CountingNvml:
    """The simulated NVML, counting the calls the monitor makes."""

    def __init__(self, inner: Nvml) -> None:
        self.inner = inner
        self.probes = 0
        self.event_sets = 0

    def probe(self, gpu_uuid: str) -> Any:
        self.probes += 1
        return self.inner.probe(gpu_uuid)

    def create_event_set(self) -> Any:
        self.event_sets += 1
        return self.inner.create_event_set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Changes:
    """The monitor's listener: every change, in order."""

    def __init__(self) -> None:
        self.items: list[HealthChange] = []
        self._cond = threading.Condition()

    def __call__(self, batch: Sequence[HealthChange]) -> None:
        with self._cond:
            self.items.extend(batch)
            self._cond.notify_all()

    def wait_for(self, uuid: str, healthy: bool, timeout: float = DEADLINE) -> HealthChange:
        def found() -> HealthChange | None:
            return next((c for c in self.items if c.uuid == uuid and c.healthy is healthy), None)

        with self._cond:
            assert self._cond.wait_for(lambda: found() is not None, timeout), f"no change {uuid} {healthy}"
            change = found()
            assert change is not None
            return change

    def uuids(self) -> set[str]:
        with self._cond:
            return {c.uuid for c in self.items}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    nvml: CountingNvml
    gpus: list[GpuInfo]
    events: Path
    changes: Changes

    def inject(self, **line: Any) -> None:
        append_sim_event(self.events, **line)

    def monitor(self, **kwargs: Any) -> HealthMonitor:
        kwargs.setdefault("settings", HealthSettings(recovery_quiet_period=0.5, probe_interval=0.05))
        kwargs.setdefault("environ", {})
        kwargs.setdefault("wait_timeout", 0.05)
        kwargs.setdefault("backoff", Backoff(0.05, 0.05))
        return HealthMonitor(self.nvml, self.gpus, kwargs.pop("listener", self.changes), **kwargs)  # type: ignore[arg-type]

    def wait_first_probe_cycle(self) -> None:
        wait_until(lambda: self.nvml.probes >= len(self.gpus), DEADLINE, "the first probe cycle")

    def advance(self, clock: FakeClock, now: float) -> None:
        """Move the fake clock and wait for the one probe cycle that this triggers to run.

        (Its last GPU's outcome may still be in flight: assertions look at other GPUs.)
        """
        target = self.nvml.probes + len(self.gpus)
        clock.now = now
        wait_until(lambda: self.nvml.probes >= target, DEADLINE, "a probe cycle")


@pytest.fixture
def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Node]]:
    opened: list[Nvml] = []

    def make(profile: str) -> Node:
        events = tmp_path / f"{profile}.events"
        events.touch()
        nvml = open_nvml(f"sim:{profile}", environ={"NVDP_SIM_EVENTS": str(events)})
        nvml.init()
        opened.append(nvml)
        return Node(CountingNvml(nvml), nvml.gpus(), events, Changes())

    yield make
    for nvml in opened:
        nvml.shutdown()


@pytest.fixture
def node(make_node: Callable[[str], Node]) -> Node:
    return make_node("dgx-a100")


@pytest.fixture
def running(node: Node) -> Iterator[HealthMonitor]:
    monitor = node.monitor()
    monitor.start()
    yield monitor
    monitor.stop()


# ---- events ---------------------------------------------------------------------------------


def test_critical_xid_flips_exactly_that_gpu(node: Node, running: HealthMonitor) -> None:
    gpu3, marker = node.gpus[3].uuid, node.gpus[7].uuid
    node.inject(uuid=gpu3, xid=79)
    change = node.changes.wait_for(gpu3, healthy=False)
    assert (change.xid, change.reason, change.fatal) == (79, "GPU has fallen off the bus", True)
    node.inject(uuid=marker, xid=48)
    node.changes.wait_for(marker, healthy=False)
    assert node.changes.uuids() == {gpu3, marker}
    assert running.status().events_by_xid == {79: 1, 48: 1}


def test_application_xid_changes_nothing(node: Node, running: HealthMonitor) -> None:
    gpu1, marker = node.gpus[1].uuid, node.gpus[2].uuid
    for xid in (13, 31, 43, 45, 68, 109):
        node.inject(uuid=gpu1, xid=xid)
    node.inject(uuid=marker, xid=79)  # events are handled in order: once this is seen, so were those
    node.changes.wait_for(marker, healthy=False)
    assert node.changes.uuids() == {marker}
    assert running.status().events_by_xid[13] == 1


def test_double_bit_ecc_event(node: Node, running: HealthMonitor) -> None:
    gpu = node.gpus[6].uuid
    node.inject(uuid=gpu, event="double-bit-ecc")
    change = node.changes.wait_for(gpu, healthy=False)
    assert (change.xid, change.fatal, change.reason) == (None, True, "double-bit ECC error")


def test_env_rules_reach_the_monitor(node: Node) -> None:
    monitor = node.monitor(environ={"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13"})
    monitor.start()
    try:
        gpu0, gpu1 = node.gpus[0].uuid, node.gpus[1].uuid
        node.inject(uuid=gpu0, xid=79)
        node.inject(uuid=gpu1, xid=13)
        node.changes.wait_for(gpu1, healthy=False)
        assert node.changes.uuids() == {gpu1}
    finally:
        monitor.stop()


def test_mig_attribution_by_instance_ids(make_node: Callable[[str], Node]) -> None:
    node = make_node("dgx-a100-mig")
    seven, three = node.gpus[0], node.gpus[1]
    assert len(seven.mig_devices) == 7 and len(three.mig_devices) == 3
    migs = [m for g in node.gpus for m in g.mig_devices]
    target = FakeTarget(
        "nvidia.com/mig-1g.5gb", [d for m in seven.mig_devices for d in replicas(seven, 2, m)]
    )
    router = HealthRouter([target])

    def both(batch: Sequence[HealthChange]) -> None:
        node.changes(batch)
        router(batch)

    monitor = node.monitor(listener=both)
    monitor.start()
    try:
        victim = seven.mig_devices[2]
        node.inject(uuid=victim.uuid, xid=94)
        node.changes.wait_for(victim.uuid, healthy=False)
        marker = node.gpus[7].uuid
        node.inject(uuid=marker, xid=79)
        node.changes.wait_for(marker, healthy=False)
        assert node.changes.uuids() == {seven.uuid, victim.uuid, marker}
        assert target.calls == [([f"{victim.uuid}::0", f"{victim.uuid}::1"], False)]

        node.inject(uuid=three.uuid, xid=94)  # no instance: every MIG device of the GPU
        for mig in three.mig_devices:
            node.changes.wait_for(mig.uuid, healthy=False)
        assert node.changes.uuids() == {seven.uuid, victim.uuid, marker, three.uuid} | {
            m.uuid for m in three.mig_devices
        }
        assert len(migs) > len(node.changes.uuids()) - 3
    finally:
        monitor.stop()


# ---- recovery -------------------------------------------------------------------------------


def test_recovery_after_quiet_period(node: Node, running: HealthMonitor) -> None:
    gpu = node.gpus[5].uuid
    node.inject(uuid=gpu, xid=94)
    down = node.changes.wait_for(gpu, healthy=False)
    assert not down.fatal
    up = node.changes.wait_for(gpu, healthy=True)
    assert up.since - down.since >= 0.5
    assert running.unhealthy() == {}


def test_new_event_restarts_the_quiet_period(node: Node) -> None:
    clock = FakeClock()
    monitor = node.monitor(clock=clock)
    monitor.start()
    try:
        node.wait_first_probe_cycle()
        gpu, marker = node.gpus[0].uuid, node.gpus[7].uuid
        node.inject(uuid=gpu, xid=94)
        node.changes.wait_for(gpu, healthy=False)
        node.advance(clock, 0.4)
        node.inject(uuid=gpu, xid=94)  # a new critical event at t=0.4
        node.inject(uuid=marker, xid=79)
        node.changes.wait_for(marker, healthy=False)
        node.advance(clock, 0.8)  # 0.8 s after the first event, 0.4 s after the second
        assert monitor.unhealthy() == {gpu: False, marker: True}
        clock.now = 0.95
        assert node.changes.wait_for(gpu, healthy=True).since == 0.95
        node.advance(clock, 100.0)
        assert monitor.unhealthy() == {marker: True}  # fatal: never recovers
    finally:
        monitor.stop()


def test_pending_retirement_blocks_recovery_until_cleared(node: Node) -> None:
    clock = FakeClock()
    monitor = node.monitor(clock=clock)
    monitor.start()
    try:
        node.wait_first_probe_cycle()
        gpu = node.gpus[1].uuid
        node.inject(uuid=gpu, event="retired-pages-pending")
        wait_until(lambda: node.nvml.inner.probe(gpu).retired_pages_pending, DEADLINE, "pending pages")
        node.inject(uuid=gpu, xid=63)
        change = node.changes.wait_for(gpu, healthy=False)
        assert not change.fatal
        node.advance(clock, 10.0)
        assert gpu in monitor.unhealthy()
        node.inject(uuid=gpu, event="clear-pending")
        wait_until(lambda: not node.nvml.inner.probe(gpu).retired_pages_pending, DEADLINE, "pending cleared")
        clock.now = 20.0
        assert node.changes.wait_for(gpu, healthy=True).since == 20.0
    finally:
        monitor.stop()


def test_recovery_disabled_with_zero_quiet_period(node: Node) -> None:
    clock = FakeClock()
    monitor = node.monitor(clock=clock, settings=HealthSettings(recovery_quiet_period=0, probe_interval=0.05))
    monitor.start()
    try:
        node.wait_first_probe_cycle()
        gpu = node.gpus[2].uuid
        node.inject(uuid=gpu, xid=94)
        node.changes.wait_for(gpu, healthy=False)
        node.advance(clock, 1000.0)
        assert monitor.unhealthy() == {gpu: False}
    finally:
        monitor.stop()


# ---- probes ---------------------------------------------------------------------------------


def test_lost_gpu_seen_by_probe_and_stays_unhealthy(node: Node, running: HealthMonitor) -> None:
    gpu = node.gpus[4].uuid
    node.inject(uuid=gpu, event="gpu-lost")
    change = node.changes.wait_for(gpu, healthy=False)
    assert (change.reason, change.fatal, change.xid) == (GPU_LOST_REASON, True, None)
    node.inject(uuid=gpu, event="gpu-restored")
    wait_until(lambda: _answers(node, gpu), DEADLINE, "GPU answers again")
    target = node.nvml.probes + 16 * len(node.gpus)  # >= 0.8 s of probing, longer than the quiet period
    wait_until(lambda: node.nvml.probes >= target, DEADLINE, "probe cycles")
    assert running.unhealthy() == {gpu: True}
    assert [c.healthy for c in node.changes.items] == [False]


def _answers(node: Node, gpu: str) -> bool:
    try:
        node.nvml.inner.probe(gpu)
    except Exception:
        return False
    return True


def test_row_remap_failure_is_fatal(node: Node, running: HealthMonitor) -> None:
    gpu = node.gpus[3].uuid
    node.inject(uuid=gpu, event="row-remap-failure")
    change = node.changes.wait_for(gpu, healthy=False)
    assert (change.reason, change.fatal) == (ROW_REMAP_FAILURE_REASON, True)


# ---- NVML failures --------------------------------------------------------------------------


def test_wait_error_keeps_states_and_rearms(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.health.monitor")
    monitor = node.monitor(backoff=Backoff(0.5, 0.5))  # degraded for 0.5 s: long enough to see
    monitor.start()
    try:
        gpu2 = node.gpus[2].uuid
        node.inject(uuid=gpu2, xid=79)
        node.changes.wait_for(gpu2, healthy=False)
        sets_before = node.nvml.event_sets
        node.inject(event="wait-error", code="NVML_ERROR_UNKNOWN")
        wait_until(lambda: monitor.degraded, DEADLINE, "degraded")
        status = monitor.status()
        assert status.degraded and "NVML_ERROR_UNKNOWN" in (status.last_error or "")
        assert "NVML event wait failed" in (status.reason or "")
        wait_until(lambda: not monitor.degraded, DEADLINE, "re-armed")
        assert monitor.status().rearms == 1
        assert node.nvml.event_sets == sets_before + 1
        assert [c.uuid for c in node.changes.items] == [gpu2]
        assert monitor.unhealthy() == {gpu2: True}
        gpu5 = node.gpus[5].uuid
        node.inject(uuid=gpu5, xid=79)  # the new event set delivers
        node.changes.wait_for(gpu5, healthy=False)
    finally:
        monitor.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("health monitor degraded; device health unchanged") == 1
    assert messages.count("health monitor re-armed") == 1


# ---- lifecycle and configuration -----------------------------------------------------------


def test_disabled_entirely(node: Node) -> None:
    monitor = node.monitor(environ={"DP_DISABLE_HEALTHCHECKS": "all"})
    monitor.start()
    assert not monitor.status().running
    assert (node.nvml.event_sets, node.nvml.probes) == (0, 0)
    monitor.stop()


def test_xids_disabled_keeps_the_probe(node: Node) -> None:
    monitor = node.monitor(environ={"DP_DISABLE_HEALTHCHECKS": "xids"})
    monitor.start()
    try:
        gpu0, gpu1 = node.gpus[0].uuid, node.gpus[1].uuid
        node.inject(uuid=gpu0, xid=79)
        node.inject(uuid=gpu1, event="gpu-lost")
        node.changes.wait_for(gpu1, healthy=False)
        assert node.changes.uuids() == {gpu1}
        assert node.nvml.event_sets == 0
    finally:
        monitor.stop()


def test_start_stop_idempotent_and_prompt(node: Node) -> None:
    monitor = node.monitor(wait_timeout=0.5)
    monitor.start()
    monitor.start()
    assert monitor.status().running
    started = time.monotonic()
    monitor.stop()
    assert time.monotonic() - started < 1.0
    assert not monitor.status().running
    monitor.stop()


@pytest.mark.parametrize("armed", [True, False], ids=["event set armed", "no event set"])
def test_a_long_wait_on_the_event_set_ends_for_an_update_and_a_stop(node: Node, armed: bool) -> None:
    """An idle monitor wakes once per wait (5 s by default): an update or a stop does not wait for it."""
    settings = HealthSettings(probe_interval=3600.0)
    environ = {} if armed else {"DP_DISABLE_HEALTHCHECKS": "xids"}
    monitor = node.monitor(wait_timeout=60.0, settings=settings, environ=environ)
    monitor.start()
    node.wait_first_probe_cycle()
    sets, probes = node.nvml.event_sets, node.nvml.probes
    started = time.monotonic()
    monitor.update_gpus(node.gpus[:4])
    if armed:
        wait_until(lambda: node.nvml.event_sets > sets, 5.0, "re-armed with the new GPUs")
    else:
        wait_until(lambda: node.nvml.probes > probes, 5.0, "the new GPUs probed")
    monitor.stop()
    assert time.monotonic() - started < 5.0
    assert not monitor.status().running


def test_update_gpus_keeps_known_states(node: Node, running: HealthMonitor) -> None:
    gpu0 = node.gpus[0].uuid
    node.inject(uuid=gpu0, xid=79)
    node.changes.wait_for(gpu0, healthy=False)
    sets = node.nvml.event_sets
    running.update_gpus(node.gpus[:4])
    wait_until(lambda: node.nvml.event_sets > sets, DEADLINE, "re-armed with the new GPUs")
    assert running.unhealthy() == {gpu0: True}
    gpu6, gpu1 = node.gpus[6].uuid, node.gpus[1].uuid
    node.inject(uuid=gpu6, xid=79)  # no longer monitored
    node.inject(uuid=gpu1, xid=79)
    node.changes.wait_for(gpu1, healthy=False)
    assert node.changes.uuids() == {gpu0, gpu1}


def test_end_to_end_log_line(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.health.router")
    target = FakeTarget("nvidia.com/gpu", [d for g in node.gpus for d in replicas(g, 2)])
    router = HealthRouter([target])
    monitor = node.monitor(listener=router)
    monitor.start()
    try:
        gpu3 = node.gpus[3]
        node.inject(uuid=gpu3.uuid, xid=79)
        wait_until(lambda: bool(target.calls), DEADLINE, "set_health")
        assert target.calls == [([f"{gpu3.uuid}::0", f"{gpu3.uuid}::1"], False)]
    finally:
        monitor.stop()
    lines = [
        TextFormatter().format(r).split(" ", 1)[1]
        for r in caplog.records
        if r.name == "nvdp.node.health.router"
    ]
    assert lines == [
        f"WARNING device unhealthy resource=nvidia.com/gpu device={gpu3.uuid} index=3 xid=79 "
        f'reason="GPU has fallen off the bus" fatal=true'
    ]
