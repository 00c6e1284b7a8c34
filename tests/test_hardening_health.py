"""Issue 9 hardening of health: every transition reported exactly once, also one that arrives before
the router has its targets (a GPU lost at start), and a monitor degraded beyond its grace period."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.backoff import Backoff
from nvdp.base.errors import NvmlError
from nvdp.node.health import HealthChange, HealthMonitor, HealthRouter, HealthSettings, MonitorStatus
from nvdp.node.nvml.sim import open_sim
from nvdp.plugins.metrics import Probes
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.builders import device, full_gpu
from tests.fakes import FakeEventSink, FakeHealth, FakeSupervisor, FakeTarget
from tests.test_health_router import FIRST, GPU0, GPU1, SECOND, down, up


@pytest.fixture
def lines() -> Iterator[list[str]]:
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    logger = logging.getLogger("nvdp.node.health.router")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_change_before_targets_is_reported_once_when_they_arrive(lines: list[str]) -> None:
    sink = FakeEventSink()
    router = HealthRouter(node_events=sink)
    router.handle([down(GPU1, xid=None, reason="GPU enumeration failed: lost")])  # no targets yet
    assert sink.recorded == []
    target = FakeTarget("nvidia.com/gpu", [device(FIRST), device(SECOND)])
    router.set_targets([target])
    assert target.calls == [([GPU1], False)]
    assert [e[:2] for e in sink.recorded] == [("Warning", "GPUUnhealthy")]
    assert 'reason="GPU enumeration failed: lost"' in sink.recorded[0][2]
    assert sum(line.startswith("device unhealthy") for line in lines) == 1
    assert not any("kept devices unhealthy" in line for line in lines)
    router.set_targets([target])  # a reload: kept, not reported again
    assert len(sink.recorded) == 1
    assert sum("kept devices unhealthy across reload" in line for line in lines) == 1


def test_held_changes_keep_their_order_and_unserved_ones_are_dropped() -> None:
    sink = FakeEventSink()
    router = HealthRouter(node_events=sink)
    router.handle([down(GPU0, since=1.0)])
    router.handle([up(GPU0, since=400.0)])
    router.handle([down("GPU-not-served")])
    target = FakeTarget("nvidia.com/gpu", [device(FIRST)])
    router.set_targets([target])
    assert [e[1] for e in sink.recorded] == ["GPUUnhealthy", "GPUHealthy"]
    assert "after=6m39s" in sink.recorded[1][2]
    assert target.calls == [([GPU0], True)]
    router.set_targets([FakeTarget("nvidia.com/gpu", [device(full_gpu(1, uuid="GPU-not-served"))])])
    assert len(sink.recorded) == 2, "a change held past one set_targets is dropped"


def test_plugin_reports_a_gpu_lost_at_start_once(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - {name: NVIDIA A100-SXM4-40GB, count: 2, lost: [false, true]}\n")
    nvml = open_sim(str(node))
    nvml.init()
    lost = nvml.gpus()[1].uuid
    nvml.shutdown()
    plugin = start_plugin(sock_dir, f"sim:{node}")
    processes.append(plugin)
    kubelet.wait_for_devices(
        "nvidia.com/gpu", lambda d: d.get(lost) is not None and d[lost].health == "Unhealthy", timeout=20
    )
    wait_until(lambda: "device unhealthy" in plugin.log(), timeout=5, what="the device unhealthy line")
    reported = [li for li in plugin.log().splitlines() if "device unhealthy" in li]
    assert len(reported) == 1
    assert f"device={lost} index=1" in reported[0] and 'reason="GPU enumeration failed: ' in reported[0]
    assert "kept devices unhealthy across reload" not in plugin.log()


# ---- a monitor degraded beyond health.degradedGracePeriod fails /readyz ------------------------


class BrokenEventSets:
    """The simulated NVML whose event sets cannot be created while `broken`."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.broken = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def create_event_set(self) -> Any:
        if self.broken:
            raise NvmlError("NVML_ERROR_UNKNOWN", "nvmlEventSetCreate")
        return self._nvml.create_event_set()


def test_monitor_degraded_beyond_grace_is_failing_and_devices_stay() -> None:
    sim = open_sim("pcie-4")
    sim.init()
    nvml = BrokenEventSets(sim)
    changes: list[HealthChange] = []
    settings = HealthSettings(probe_interval=0.05, degraded_grace_period=0.3)
    monitor = HealthMonitor(
        nvml,
        sim.gpus(),
        changes.extend,
        settings=settings,
        environ={},
        wait_timeout=0.02,
        backoff=Backoff(0.05, 0.05),
    )
    monitor.start()
    try:
        assert monitor.degraded and monitor.status().failing is None, "within the grace period"
        failing = wait_until(lambda: monitor.status().failing, timeout=5, what="failing")
        assert re.fullmatch(
            r"health monitor degraded for \d+ms \(over health.degradedGracePeriod 300ms\): cannot create "
            r"the NVML event set: nvmlEventSetCreate failed: NVML_ERROR_UNKNOWN; device health unchanged",
            failing,
        ), failing
        assert changes == [] and monitor.unhealthy() == {}
        nvml.broken = False
        wait_until(lambda: not monitor.degraded, timeout=5, what="re-armed")
        assert monitor.status().failing is None
    finally:
        monitor.stop()
        sim.shutdown()


def test_readyz_fails_with_the_reason_once_failing() -> None:
    probes = Probes(
        FakeSupervisor({"nvidia.com/gpu": True}),
        FakeHealth(
            status=MonitorStatus(
                True, True, "NVML event wait failed", "x", 0, failing="health monitor degraded ..."
            )
        ),
    )
    assert probes.readiness_problem() == "health monitor degraded ..."


def test_degraded_grace_period_config_key() -> None:
    from nvdp.config import parse
    from nvdp.node.health.settings import health_settings

    assert health_settings(parse({})).degraded_grace_period == 300.0
    assert health_settings(parse({"health": {"degradedGracePeriod": "90s"}})).degraded_grace_period == 90.0
    assert (
        parse({"health": {"degradedGracePeriod": "2m"}}).to_dict()["health"]["degradedGracePeriod"] == "2m0s"
    )
