"""The device rescan (pure parts and the timer) with a hand-written node: layouts, changes, one
report per new layout, the counter, failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from nvdp.base.errors import NvdpError
from nvdp.base.promtext import Registry
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.kubeletplugin.rescan import (
    GpuLayout,
    LayoutRescanner,
    layout_change_counter,
    layout_changes,
    layout_of,
    rescanner_for,
)
from tests.builders import full_gpu, mig_enabled_gpu, with_facts
from tests.readings import log_lines


def test_layout_is_mig_mode_instances_and_mig_uuids_only() -> None:
    (a,) = layout_of([mig_enabled_gpu(0, "1g.5gb", "1g.5gb", "2g.10gb")]).values()
    instances = ((7, 0, "1g.5gb"), (8, 0, "1g.5gb"), (9, 0, "2g.10gb"))
    uuids = ("MIG-0-0-1g.5gb", "MIG-0-1-1g.5gb", "MIG-0-2-2g.10gb")
    assert a == GpuLayout(0, "GPU-0", True, instances, uuids)
    assert a.describe() == "2x1g.5gb+1x2g.10gb"
    assert layout_of([full_gpu(1)])["GPU-1"].describe() == "MIG disabled"
    assert layout_of([mig_enabled_gpu(1)])["GPU-1"].describe() == "MIG enabled, no MIG devices"
    assert layout_of([full_gpu(0, memory_bytes=80 << 30)]) == layout_of([full_gpu(0)]), (
        "other facts are no layout change"
    )


def test_changes_per_gpu_in_index_order() -> None:
    old = layout_of([mig_enabled_gpu(0, "7g.40gb"), full_gpu(1), full_gpu(2)])
    new = layout_of([mig_enabled_gpu(0, "3g.20gb", "4g.20gb"), full_gpu(2), full_gpu(3)])
    assert [(c.kind, c.gpu.index) for c in layout_changes(old, new)] == [
        ("mig", 0),
        ("gpu-disappeared", 1),
        ("gpu-appeared", 3),
    ]


class RescannedNode:
    """What the rescanner reads (the node now) and what the supervisor serves."""

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self.now = gpus
        self.served: list[GpuInfo] | None = list(gpus)
        self.requests = 0
        self.failure: NvdpError | None = None
        self.requested = threading.Event()

    def read(self) -> dict[str, GpuLayout]:
        if self.failure is not None:
            raise self.failure
        return layout_of(self.now)

    def request(self) -> None:
        self.requests += 1
        self.requested.set()


def rescanner(node: RescannedNode, counted: list[str] | None = None) -> LayoutRescanner:
    return LayoutRescanner(
        node.read,
        lambda: node.served,
        node.request,
        10.0,
        counted=None if counted is None else counted.append,
    )


def test_a_change_is_logged_per_gpu_counted_and_applied_once(caplog: pytest.LogCaptureFixture) -> None:
    node = RescannedNode([mig_enabled_gpu(0, "7g.40gb"), full_gpu(1)])
    counted: list[str] = []
    scan = rescanner(node, counted)
    assert scan.check() == [] and node.requests == 0
    node.now = [mig_enabled_gpu(0, "3g.20gb", "4g.20gb"), mig_enabled_gpu(1)]
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.rescan"):
        assert len(scan.check()) == 2
    assert node.requests == 1 and counted == ["mig", "mig"]
    assert log_lines(caplog) == [
        "MIG layout changed gpu=0 uuid=GPU-0 old=1x7g.40gb new=1x3g.20gb+1x4g.20gb",
        'MIG layout changed gpu=1 uuid=GPU-1 old="MIG disabled" new="MIG enabled, no MIG devices"',
    ]
    # Not applied (e.g. the config refuses it): said once, not every tick.
    assert scan.check() == [] and node.requests == 1
    node.served = list(node.now)  # applied
    assert scan.check() == [] and node.requests == 1
    node.now = [mig_enabled_gpu(0, "7g.40gb"), mig_enabled_gpu(1)]
    assert [c.kind for c in scan.check()] == ["mig"] and node.requests == 2


def test_the_same_layout_created_again_is_a_change(caplog: pytest.LogCaptureFixture) -> None:
    node = RescannedNode([mig_enabled_gpu(0, "3g.20gb", "4g.20gb")])
    counted: list[str] = []
    scan = rescanner(node, counted)
    again = mig_enabled_gpu(0, "3g.20gb", "4g.20gb")
    node.now = [
        replace(again, mig_devices=tuple(replace(m, uuid=m.uuid + "-new") for m in again.mig_devices))
    ]
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.rescan"):
        assert [c.kind for c in scan.check()] == ["mig"]
    assert node.requests == 1 and counted == ["mig"]
    assert log_lines(caplog) == [
        "MIG layout changed gpu=0 uuid=GPU-0 old=1x3g.20gb+1x4g.20gb new=1x3g.20gb+1x4g.20gb"
        ' recreated="new MIG device UUIDs"'
    ]


def test_gpus_appearing_and_disappearing_take_the_same_path() -> None:
    node = RescannedNode([full_gpu(0), full_gpu(1)])
    counted: list[str] = []
    scan = rescanner(node, counted)
    node.now = [full_gpu(0), full_gpu(2)]
    scan.check()
    assert counted == ["gpu-disappeared", "gpu-appeared"] and node.requests == 1


def test_nothing_before_the_first_enumeration_and_failures_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = RescannedNode([full_gpu(0)])
    node.served = None
    scan = rescanner(node)
    node.now = [mig_enabled_gpu(0)]
    assert scan.check() == [] and node.requests == 0
    node.served = [full_gpu(0)]
    node.failure = NvdpError("nvmlDeviceGetCount: NVML_ERROR_UNKNOWN")
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.rescan"):
        scan.check()
        scan.check()
        node.failure = None
        scan.check()
    assert log_lines(caplog) == [
        'device rescan: enumeration failed; will retry error="nvmlDeviceGetCount: NVML_ERROR_UNKNOWN"',
        "device rescan: enumeration works again",
        'MIG layout changed gpu=0 uuid=GPU-0 old="MIG disabled" new="MIG enabled, no MIG devices"',
    ]
    assert node.requests == 1


def test_the_timer_thread_requests_and_stops() -> None:
    node = RescannedNode([full_gpu(0)])
    scan = LayoutRescanner(node.read, lambda: node.served, node.request, 0.01)
    scan.start()
    try:
        node.now = [mig_enabled_gpu(0, "7g.40gb")]
        assert node.requested.wait(5.0)
    finally:
        scan.stop()
        scan.stop()
    assert node.requests == 1


def test_counter_family_starts_at_zero() -> None:
    registry = Registry()
    count = layout_change_counter(registry)
    count("mig")
    text = registry.render().decode()
    assert 'nvdp_device_layout_changes_total{kind="mig"} 1' in text
    assert 'nvdp_device_layout_changes_total{kind="gpu-appeared"} 0' in text


class CountingNode:
    """A node's NVML as the rescanner may use it: counts full enumerations and layout queries."""

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self.now = gpus
        self.enumerations = 0
        self.layout_queries = 0

    def gpus(self) -> list[GpuInfo]:
        self.enumerations += 1
        return list(self.now)

    def mig_layout(self) -> dict[str, GpuLayout]:
        self.layout_queries += 1
        return layout_of(self.now)


class Served(list[GpuInfo]):
    """The supervisor's served enumeration, counting how often it is walked."""

    walks = 0

    def __iter__(self) -> Iterator[GpuInfo]:
        self.walks += 1
        return super().__iter__()


class Target:
    def __init__(self, served: list[GpuInfo]) -> None:
        self.served: list[GpuInfo] = served
        self.requests = 0

    def served_gpus(self) -> list[GpuInfo]:
        return self.served

    def request_rescan(self) -> None:
        self.requests += 1


def test_a_tick_without_change_is_the_layout_query_only() -> None:
    node = CountingNode([mig_enabled_gpu(0, "3g.20gb", "4g.20gb"), full_gpu(1), mig_enabled_gpu(2)])
    target = Target(Served(node.gpus()))
    node.enumerations = 0
    scan = rescanner_for(10.0, node, target, None)
    assert scan is not None
    for _ in range(5):
        assert scan.check() == []
    assert (node.enumerations, node.layout_queries, target.requests) == (0, 5, 0)
    assert isinstance(target.served, Served) and target.served.walks == 1, "served layout derived once"
    node.now = [mig_enabled_gpu(0, "7g.40gb"), full_gpu(1), mig_enabled_gpu(2)]
    assert [c.kind for c in scan.check()] == ["mig"]
    assert (node.enumerations, target.requests) == (0, 1), "the supervisor's apply enumerates, not the tick"
    target.served = Served(node.gpus())  # applied
    assert scan.check() == [] and target.served.walks == 1 and target.requests == 1


def test_a_gpu_gone_from_the_layout_query_is_reported() -> None:
    node = CountingNode([full_gpu(0), mig_enabled_gpu(1, "7g.40gb")])
    target = Target(node.gpus())
    scan = rescanner_for(10.0, node, target, None)
    assert scan is not None
    node.now = [full_gpu(0)]
    assert [(c.kind, c.gpu.index, c.gpu.describe()) for c in scan.check()] == [
        ("gpu-disappeared", 1, "1x7g.40gb")
    ]
    node.now = [full_gpu(0), mig_enabled_gpu(1, "7g.40gb"), full_gpu(2)]
    assert [(c.kind, c.gpu.index) for c in scan.check()] == [("gpu-appeared", 2)]
    assert target.requests == 2 and node.enumerations == 1


def test_a_gpu_whose_index_shifts_is_a_change_of_its_own(caplog: pytest.LogCaptureFixture) -> None:
    node = RescannedNode([full_gpu(0), mig_enabled_gpu(1, "7g.40gb")])
    counted: list[str] = []
    scan = rescanner(node, counted)
    moved = with_facts(mig_enabled_gpu(1, "7g.40gb"), index=0)
    node.now = [moved]  # GPU 0 unplugged: GPU 1 is index 0 now
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.rescan"):
        scan.check()
    assert counted == ["gpu-disappeared", "gpu-index"]
    assert log_lines(caplog) == [
        'GPU disappeared gpu=0 uuid=GPU-0 old="MIG disabled"',
        "GPU index changed gpu=0 uuid=GPU-1 old=1",
    ]
