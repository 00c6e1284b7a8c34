"""Partitionable devices, pure parts: a dynamic-MIG GPU's counter set and placement devices
(nvdp.plugins.dra.mig_partitions), the slices that carry counter sets (nvdp.plugins.dra.slices), and the
stand-in scheduler's counting of them (nvdp.sim.dra.counters)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nvdp.node.nvml.sim import open_sim
from nvdp.node.nvml.sim.mig_control import profiles_of
from nvdp.node.nvml.types import GpuInfo, MigPlacement
from nvdp.plugins.dra.devices import DriverFacts
from nvdp.plugins.dra.mig_partitions import partitions
from nvdp.plugins.dra.slices import pool_slices
from nvdp.sim.dra.counters import Counters, quantity
from nvdp.sim.dra.scheduler import AllocationError, allocate, nvidia_device_classes

FACTS = DriverFacts("550.54.15", "12.4")


def _placement_gpu(index: int = 0) -> tuple[Any, GpuInfo]:
    node = open_sim("dgx-a100-mig-empty")
    node.init()
    return node, node.gpus()[index]


def test_counter_set_and_placements_of_an_a100() -> None:
    node, gpu = _placement_gpu()
    devices = partitions(gpu, profiles_of(node.node.gpus[0]), FACTS)
    assert len(devices) == 25  # 7 + 7 + 4 + 3 + 2 + 1 + 1 placements
    counters = devices[0].counter_set["counters"]  # type: ignore[index]
    assert devices[0].counter_set["name"] == "gpu-0-counter-set"  # type: ignore[index]
    assert {k: v["value"] for k, v in counters.items() if not k.startswith("memory-slice")} == {
        "memory": "40192Mi",
        "multiprocessors": "98",
        "copy-engines": "7",
        "decoders": "5",
        "encoders": "0",
        "jpeg-engines": "1",
        "ofa-engines": "1",
    }
    assert [k for k in counters if k.startswith("memory-slice")] == [f"memory-slice-{n}" for n in range(8)]
    by_name = {d.name: d for d in devices}
    three = by_name["gpu-0-mig-3g20gb-9-4"]
    assert three.placement == MigPlacement(9, 4, 4) and "uuid" not in three.attributes
    consumed = three.slice_entry()["consumesCounters"][0]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert sorted(k for k in consumed["counters"] if k.startswith("memory-slice")) == [
        f"memory-slice-{n}" for n in (4, 5, 6, 7)
    ]


def test_a_mig_device_no_claim_made_is_taken_out_of_the_counters() -> None:
    node, gpu = _placement_gpu()
    made = node.mig_control().create_mig_device(gpu.uuid, MigPlacement(14, 2, 2))  # 2g.10gb, slices 2-3
    counters = partitions(gpu, profiles_of(node.node.gpus[0]), FACTS, [made])[0].counter_set["counters"]  # type: ignore[index]
    assert counters["memory-slice-2"] == counters["memory-slice-3"] == {"value": "0"}
    assert counters["memory-slice-4"] == {"value": "1"}
    assert counters["memory"] == {"value": f"{40192 - 9984}Mi"}
    assert counters["multiprocessors"] == {"value": "70"}


def test_counter_sets_have_slices_of_their_own_eight_a_slice() -> None:
    node = open_sim("dgx-a100-mig-empty")
    node.init()
    devices = [
        replace(d, counter_set={**d.counter_set, "name": f"gpu-{n}-counter-set"})  # type: ignore[dict-item]
        for n in range(10)
        for d in partitions(node.gpus()[0], profiles_of(node.node.gpus[0]), FACTS)[:1]
    ]
    slices = pool_slices("node-a", 1, devices, {}, taints=True)
    assert [len(s["spec"].get("sharedCounters") or []) for s in slices] == [8, 2, 0]
    assert ["devices" in s["spec"] for s in slices] == [False, False, True]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}


def _slices(consumes: dict[str, list[int]], slots: int = 2) -> list[dict[str, Any]]:
    counters = {f"s{n}": {"value": "1"} for n in range(slots)}
    devices = [
        {
            "name": name,
            "attributes": {"type": {"string": "mig"}},
            "consumesCounters": [
                {"counterSet": "set", "counters": {f"s{n}": {"value": "1"} for n in taken}},
            ],
        }
        for name, taken in consumes.items()
    ]
    pool = {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
    spec = {"driver": "gpu.nvidia.com", "nodeName": "node-a", "pool": pool}
    return [
        {"spec": {**spec, "sharedCounters": [{"name": "set", "counters": counters}]}},
        {"spec": {**spec, "devices": devices}},
    ]


def _claim(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 1}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def test_the_stand_in_scheduler_never_allocates_overlapping_placements() -> None:
    slices = _slices({"whole": [0, 1], "left": [0], "right": [1]})
    classes = nvidia_device_classes()
    first = allocate(_claim("a"), classes, slices, set(), "node-a")
    assert [r["device"] for r in first["devices"]["results"]] == ["whole"]
    with pytest.raises(AllocationError) as info:  # "left" and "right" overlap "whole"
        allocate(_claim("b"), classes, slices, {("gpu.nvidia.com", "node-a", "whole")}, "node-a")
    assert (
        str(info.value)
        == "request gpu: 1 device(s) of class mig.nvidia.com wanted, 0 free on node node-a match"
    )
    taken = {("gpu.nvidia.com", "node-a", "left")}
    second = allocate(_claim("c"), classes, slices, taken, "node-a")
    assert [r["device"] for r in second["devices"]["results"]] == ["right"]


def test_counters_of_a_set_the_pool_lacks_never_fit() -> None:
    slices = _slices({"lost": [0]})
    slices[1]["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] = "other"
    assert not Counters(slices).fits(("gpu.nvidia.com", "node-a", "lost"))


@pytest.mark.parametrize(
    ("text", "value"),
    [("40192Mi", 40192 << 20), ("14", 14), ("6Gi", 6 << 30), ("500m", 0.5), ("2k", 2000)],
    ids=["mi", "count", "gi", "milli", "kilo"],
)
def test_quantities(text: str, value: float) -> None:
    assert quantity(text) == value


def test_a_bad_quantity() -> None:
    with pytest.raises(ValueError, match=r"^'12 Gi' is not a quantity$"):
        quantity("12 Gi")
