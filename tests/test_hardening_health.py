"""Issue 9 hardening of health: every transition reported exactly once, also one that arrives before
the router has its targets (a GPU lost at start), and a monitor degraded beyond its grace period."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import Process, start_plugin, wait_until
from nvdp.health import HealthRouter
from nvdp.kubelet import Kubelet
from nvdp.nvml.sim import open_sim
from tests.health_fakes import FakeTarget
from tests.test_health_router import GPU0, GPU1, device, down, up


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, event_type: str, reason: str, message: str) -> None:
        self.events.append((event_type, reason, message))

    def close(self, timeout: float = 1.0) -> None:
        pass


@pytest.fixture
def lines() -> Iterator[list[str]]:
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    logger = logging.getLogger("nvdp.health.router")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_change_before_targets_is_reported_once_when_they_arrive(lines: list[str]) -> None:
    sink = Sink()
    router = HealthRouter(node_events=sink)
    router.handle([down(GPU1, xid=None, reason="GPU enumeration failed: lost")])  # no targets yet
    assert sink.events == []
    target = FakeTarget("nvidia.com/gpu", [device(GPU0, "0"), device(GPU1, "1")])
    router.set_targets([target])
    assert target.calls == [([GPU1], False)]
    assert [e[:2] for e in sink.events] == [("Warning", "GPUUnhealthy")]
    assert 'reason="GPU enumeration failed: lost"' in sink.events[0][2]
    assert sum(line.startswith("device unhealthy") for line in lines) == 1
    assert not any("kept devices unhealthy" in line for line in lines)
    router.set_targets([target])  # a reload: kept, not reported again
    assert len(sink.events) == 1
    assert sum("kept devices unhealthy across reload" in line for line in lines) == 1


def test_held_changes_keep_their_order_and_unserved_ones_are_dropped() -> None:
    sink = Sink()
    router = HealthRouter(node_events=sink)
    router.handle([down(GPU0, since=1.0)])
    router.handle([up(GPU0, since=400.0)])
    router.handle([down("GPU-not-served")])
    target = FakeTarget("nvidia.com/gpu", [device(GPU0, "0")])
    router.set_targets([target])
    assert [e[1] for e in sink.events] == ["GPUUnhealthy", "GPUHealthy"]
    assert "after=6m39s" in sink.events[1][2]
    assert target.calls == [([GPU0], True)]
    router.set_targets([FakeTarget("nvidia.com/gpu", [device("GPU-not-served", "1")])])
    assert len(sink.events) == 2, "a change held past one set_targets is dropped"


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
