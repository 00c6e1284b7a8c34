"""The scheduler never sees a GPU twice (`nvdp.plugins.dra.node_count`): the device plugin's record says how
many devices each of its resources lists, and the DRA driver offers a GPU it takes from the device
plugin only once the Node counts no more than that. (The process test is
tests/test_one_gpu_one_api_e2e.py::test_the_scheduler_never_sees_a_gpu_in_both_apis.)"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nvdp.base.errors import KubeError
from nvdp.plugins.dra.cluster import NodeCounts
from nvdp.plugins.dra.node_count import NodeCountGate, still_counted
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, Handoff, Record
from tests.builders import sim_gpus

A, B, C, D = (g.uuid for g in sim_gpus("pcie-4"))
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.5gb"


@pytest.mark.parametrize(
    "capacity, allocatable, units, counted",
    [
        ({GPU: "2"}, {GPU: "2"}, {GPU: 2}, []),
        ({GPU: "4"}, {GPU: "4"}, {GPU: 2}, [f"{GPU}: Node capacity 4 > 2 listed"]),
        ({GPU: "4"}, {GPU: "2"}, {GPU: 2}, [f"{GPU}: Node capacity 4 > 2 listed"]),  # 2 unhealthy
        ({GPU: "8"}, {GPU: "0"}, {GPU: 0}, []),  # a stopped plugin's devices: unhealthy, in capacity
        ({GPU: "8"}, {GPU: "8"}, {GPU: 0}, [f"{GPU}: Node allocatable 8 > 0 listed"]),
        ({}, {}, {GPU: 0, MIG: 3}, []),  # the Node not written yet: counts nothing
        ({GPU: "2k"}, {GPU: "2k"}, {GPU: 1999}, [f"{GPU}: Node capacity 2k > 1999 listed"]),
        ({GPU: "2k"}, {GPU: "2k"}, {GPU: 2000}, []),
        ({GPU: "1.5"}, {}, {GPU: 4}, [f"{GPU}: Node capacity 1.5 > 4 listed"]),  # not whole: counted
        ({GPU: "4", MIG: "7"}, {GPU: "4", MIG: "7"}, {MIG: 3}, [f"{MIG}: Node capacity 7 > 3 listed"]),
        ({GPU: "4"}, {GPU: "4"}, {}, []),  # no device plugin record: nothing to wait for
    ],
    ids=[
        "steady",
        "not-written-yet",
        "unhealthy-in-capacity",
        "stopped-plugin",
        "stopped-plugin-counted",
        "no-status",
        "si-suffix-more",
        "si-suffix-equal",
        "not-whole",
        "mig-resource",
        "no-units",
    ],
)
def test_the_rule(
    capacity: dict[str, str], allocatable: dict[str, str], units: dict[str, int], counted: list[str]
) -> None:
    assert still_counted(NodeCounts(capacity, allocatable), units) == counted


class FakeNodeApi:
    """The ResourceApi's Node reads (the rest is not used by the gate)."""

    def __init__(self, counts: NodeCounts | None) -> None:
        self.counts: NodeCounts | None | KubeError = counts
        self.reads = 0

    def node_counts(self, node: str) -> NodeCounts | None:
        assert node == "node-a"
        self.reads += 1
        if isinstance(self.counts, KubeError):
            raise self.counts
        return self.counts


def gate(api: FakeNodeApi, **timing: float) -> NodeCountGate:
    return NodeCountGate(api, "node-a", **timing)  # type: ignore[arg-type]  # the Node reads only


def test_a_gpu_waits_while_the_node_counts_it_and_then_is_offered(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeNodeApi(NodeCounts({GPU: "2"}, {GPU: "2"}))
    node_count = gate(api, poll=3600.0)
    caplog.set_level(logging.INFO)
    # A, B offered; C taken from the device plugin, which lists 1 device now: the Node counts 2
    assert node_count.offer(frozenset({A, B, C}), frozenset({A, B}), {GPU: 1}) == {A, B}
    assert api.reads == 1
    assert node_count.retry_in() is not None and not node_count.due()
    # asked again before the next read is due (a claim prepared): no read, C still waits
    assert node_count.offer(frozenset({A, B, C}), frozenset({A, B}), {GPU: 1}) == {A, B}
    assert api.reads == 1
    # a GPU newly waiting is read for at once
    assert node_count.offer(frozenset({A, B, C, D}), frozenset({A, B}), {GPU: 0}) == {A, B}
    assert api.reads == 2
    assert node_count.misfits({C: "GPU 2"}) == ()  # not said before warn_after
    api.counts = NodeCounts({GPU: "2"}, {GPU: "0"})  # the kubelet wrote the Node's status
    node_count._next_check = 0.0  # the poll is due
    assert node_count.due()
    assert node_count.offer(frozenset({A, B, C, D}), frozenset({A, B}), {GPU: 0}) == {A, B, C, D}
    assert node_count.retry_in() is None and not node_count.due()
    assert "GPUs offered once the Node stopped counting them" in caplog.text
    # offered now: nothing newly served, no read
    assert node_count.offer(frozenset({A, B, C, D}), frozenset({A, B, C, D}), {GPU: 0}) == {A, B, C, D}
    assert api.reads == 3


@pytest.mark.parametrize(
    "counts, units, reads",
    [(None, {GPU: 0}, 1), (NodeCounts({GPU: "9"}, {GPU: "9"}), {}, 0)],
    ids=["no-node", "no-device-plugin-record"],
)
def test_nothing_to_wait_for(counts: NodeCounts | None, units: dict[str, int], reads: int) -> None:
    api = FakeNodeApi(counts)
    assert gate(api).offer(frozenset({A}), frozenset(), units) == {A}
    assert api.reads == reads


def test_a_node_that_cannot_be_read_keeps_the_gpu_waiting_said_once_with_a_misfit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeNodeApi(None)
    api.counts = KubeError("cannot read node node-a: connection refused")
    node_count = gate(api, warn_after=0.0, slow_poll=3600.0)
    for _ in range(3):
        node_count._next_check = 0.0
        assert node_count.offer(frozenset({A, C}), frozenset({A}), {GPU: 1}) == {A}
    assert api.reads == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(" node=")[0] for r in warnings] == [
        "GPUs not offered: the Node still counts the device plugin's devices; waiting"
    ]
    (misfit,) = node_count.misfits({C: "GPU 2"})
    assert misfit.reason == "GpuCountedByNode"
    assert misfit.message == (
        f"GPU 2 ({C}): the config gives it to the DRA driver, but the Node still counts the device plugin's"
        " devices (cannot read node node-a: connection refused); offered once not"
    )
    assert 3000 < (node_count.retry_in() or 0) <= 3600  # read slowly once said
    # the config gives C back to the device plugin: nothing waits
    assert node_count.offer(frozenset({A}), frozenset({A}), {GPU: 1}) == {A}
    assert node_count.misfits({}) == () and node_count.retry_in() is None


def test_the_device_plugins_record_says_its_units_and_keeps_a_resource_it_stopped_at_0(
    tmp_path: Path,
) -> None:
    plugin, dra = Handoff(DEVICE_PLUGIN, tmp_path), Handoff(DRA, tmp_path)
    try:
        plugin.served(plugin.settle(frozenset({A, B}), {}).serve, {GPU: 2, MIG: 7})
        said = json.loads((tmp_path / "served-by-device-plugin.json").read_text())
        assert said["units"] == {GPU: 2, MIG: 7}
        plugin.served(plugin.settle(frozenset({A}), {}).serve, {GPU: 1})
        dra.settle(frozenset({B}), {})
        assert dra.other.units == {GPU: 1, MIG: 0}
        assert dra.other.advertised() == {GPU: 1, MIG: 0}
        dra.served(frozenset({B}))
        assert "units" not in json.loads((tmp_path / "served-by-dra.json").read_text())
    finally:
        plugin.close()
    dra.settle(frozenset({B}), {})  # the plugin stopped: it advertises nothing
    assert dra.other.alive is False
    assert dra.other.advertised() == {GPU: 0, MIG: 0}
    dra.close()


@pytest.mark.parametrize(
    "units", [{GPU: -1}, {GPU: "2"}, {GPU: True}, [GPU]], ids=["negative", "string", "bool", "not-a-map"]
)
def test_a_record_with_bad_units_is_unknown(tmp_path: Path, units: object) -> None:
    (tmp_path / "served-by-device-plugin.json").write_text(
        json.dumps({"serving": [], "holds": {}, "units": units})
    )
    dra = Handoff(DRA, tmp_path)
    try:
        assert dra.settle(frozenset({A}), {}).serve == frozenset()  # fail closed: A waits
        assert dra.other == Record(alive=False, known=False)
    finally:
        dra.close()


def test_after_a_failed_read_the_node_is_read_again_slowly() -> None:
    api = FakeNodeApi(None)
    api.counts = KubeError("cannot read node node-a: timed out")
    node_count = gate(api, poll=0.5, slow_poll=3600.0)
    assert node_count.offer(frozenset({A}), frozenset(), {GPU: 0}) == frozenset()
    assert (node_count.retry_in() or 0) > 3000
    api.counts = NodeCounts({GPU: "1"}, {GPU: "1"})  # read: counted still, the poll is quick again
    node_count._next_check = 0.0
    assert node_count.offer(frozenset({A}), frozenset(), {GPU: 0}) == frozenset()
    assert (node_count.retry_in() or 0) <= 0.5
