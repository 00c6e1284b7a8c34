"""Preferred allocation on the simulated nodes, for the cases users of NVIDIA's plugin reported."""

from __future__ import annotations

from functools import cache
from itertools import combinations

import pytest

from nvdp.node.nvml import open_nvml
from nvdp.plugins.deviceplugin.allocation import Allocator, Topology
from testkit.synthetic import gpu_devices


@cache
def profile(name: str) -> tuple[list[str], Topology]:
    """The GPU uuids (by index) and topology of a simulated node, read through the facade."""
    nvml = open_nvml(f"sim:{name}")
    nvml.init()
    try:
        gpus = nvml.gpus()
        return [g.uuid for g in gpus], Topology.from_nvml(nvml, gpus)
    finally:
        nvml.shutdown()


def preferred(name: str, available: list[int], must: list[int], size: int) -> list[int]:
    uuids, topo = profile(name)
    allocator = Allocator(gpu_devices(uuids, [topo.numa_nodes[u] for u in uuids]), topo)
    got = allocator.preferred([uuids[i] for i in available], [uuids[i] for i in must], size)
    return [uuids.index(u) for u in got]


def nvlinks(name: str, a: int, b: int) -> int:
    uuids, topo = profile(name)
    return topo.link(uuids[a], uuids[b]).nvlinks


def test_profiles_have_the_documented_topology() -> None:
    assert [nvlinks("pcie-4", a, b) for a, b in combinations(range(4), 2)] == [4, 0, 0, 0, 0, 4]
    for name in ("dgx-a100", "dgx-h100"):
        uuids, topo = profile(name)
        assert [topo.numa_nodes[u] for u in uuids] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert {nvlinks(name, a, b) for a, b in combinations(range(8), 2)} == {
            12 if name == "dgx-a100" else 18
        }


PCIE4_PARTNER = {0: 1, 1: 0, 2: 3, 3: 2}


PCIE4_FREE_SETS_WITH_A_PAIR = [
    s for n in (2, 3, 4) for s in combinations(range(4), n) if any(PCIE4_PARTNER[i] in s for i in s)
]


@pytest.mark.parametrize(
    "available",
    [pytest.param(list(s), id="free-" + "".join(map(str, s))) for s in PCIE4_FREE_SETS_WITH_A_PAIR],
)
def test_pcie4_two_gpus_always_get_an_nvlink_pair(available: list[int]) -> None:
    a, b = preferred("pcie-4", available, [], 2)
    assert nvlinks("pcie-4", a, b) == 4


@pytest.mark.parametrize(
    ("name", "taken", "partner"),
    [pytest.param("pcie-4", t, p, id=f"pcie-4-taken-{t}") for t, p in PCIE4_PARTNER.items()]
    + [pytest.param("dgx-a100", t, t ^ 1, id=f"dgx-a100-taken-{t}") for t in range(8)]
    + [
        pytest.param("dgx-h100", 0, 1, id="dgx-h100-taken-0"),
        pytest.param("dgx-h100", 5, 4, id="dgx-h100-taken-5"),
    ],
)
def test_after_one_gpu_of_a_pair_is_taken_one_gpu_takes_its_partner(
    name: str, taken: int, partner: int
) -> None:
    gpus = 4 if name == "pcie-4" else 8
    assert preferred(name, [i for i in range(gpus) if i != taken], [], 1) == [partner]


@pytest.mark.parametrize(
    ("available", "must", "want"),
    [
        pytest.param(list(range(8)), [], [0, 1, 2, 3], id="all-free"),
        pytest.param([1, 2, 3, 4, 5, 6, 7], [], [4, 5, 6, 7], id="node0-broken"),
        pytest.param(list(range(8)), [6], [4, 5, 6, 7], id="must-on-node1"),
        # Node 0 has 3 free: {0, 1, 2, 4} and {2, 4, 5, 6} score the same; the first leaves 3 GPUs
        # on one node for the next request.
        pytest.param([0, 1, 2, 4, 5, 6, 7], [2], [0, 1, 2, 4], id="short-node-spills-least"),
    ],
)
@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
def test_four_gpus_stay_on_one_numa_node(
    name: str, available: list[int], must: list[int], want: list[int]
) -> None:
    assert preferred(name, available, must, 4) == want


@pytest.mark.parametrize("name", ["pcie-4", "dgx-a100", "dgx-h100"])
def test_every_size_and_single_must_include_is_optimal(name: str) -> None:
    uuids, topo = profile(name)
    gpus = range(len(uuids))
    for size in range(1, len(uuids) + 1):
        for must in [[], *([i] for i in gpus)]:
            got = preferred(name, list(gpus), must, size)
            best = max(
                topo.set_score(uuids[i] for i in chosen)
                for chosen in combinations(gpus, size)
                if set(must) <= set(chosen)
            )
            assert topo.set_score(uuids[i] for i in got) == best, (size, must, got)
