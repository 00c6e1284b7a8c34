"""Preferred allocation: scoring, tie-breaks, errors, replica and MIG policies."""

from __future__ import annotations

from itertools import combinations

import pytest

from nvdp.base.errors import RequestError
from nvdp.node.gpus.devices import Device
from nvdp.node.nvml.types import GpuLink, PcieLevel
from nvdp.plugins.deviceplugin.allocation import (
    NVLINK_SCORE,
    PCIE_SCORE,
    AllocationPolicy,
    Allocator,
    Topology,
    pair_score,
)
from testkit.synthetic import gpu_devices
from tests.builders import device, full_gpu, mig_device_info, replicas

U = [f"GPU-{i}" for i in range(8)]
SYS = GpuLink(0, PcieLevel.SYSTEM)


def node(numa: list[int | None], links: dict[tuple[int, int], GpuLink], default: GpuLink = SYS) -> Allocator:
    """An allocator over len(numa) whole GPUs; pairs not in `links` get `default`."""
    uuids = U[: len(numa)]
    pairs = {(uuids[a], uuids[b]): links.get((a, b), default) for a, b in combinations(range(len(numa)), 2)}
    return Allocator(gpu_devices(uuids, numa), Topology(dict(zip(uuids, numa, strict=True)), pairs))


def ids(*indices: int) -> list[str]:
    return [U[i] for i in indices]


# -- scoring -------------------------------------------------------------------------------------


def test_one_nvlink_outranks_every_pcie_relation_and_more_links_outrank_fewer() -> None:
    best_pcie = max(pair_score(GpuLink(0, level)) for level in PcieLevel)
    assert pair_score(GpuLink(1, PcieLevel.SYSTEM)) > best_pcie
    for links in range(1, 18):
        assert pair_score(GpuLink(links + 1, PcieLevel.SYSTEM)) > pair_score(
            GpuLink(links, PcieLevel.INTERNAL)
        )
    assert NVLINK_SCORE > max(PCIE_SCORE.values())


def test_pcie_relations_rank_closest_first() -> None:
    order = [PcieLevel.INTERNAL, PcieLevel.SINGLE, PcieLevel.MULTIPLE, PcieLevel.HOSTBRIDGE, PcieLevel.NODE]
    order.append(PcieLevel.SYSTEM)
    scores = [pair_score(GpuLink(0, level)) for level in order]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


def test_topology_defaults_unknown_pairs_by_numa_node_and_sums_set_scores() -> None:
    topo = Topology({"a": 0, "b": 0, "c": 1, "d": None}, {("b", "a"): GpuLink(2, PcieLevel.SINGLE)})
    assert topo.link("a", "b") == GpuLink(2, PcieLevel.SINGLE)
    assert topo.link("a", "c") == GpuLink(0, PcieLevel.SYSTEM)
    assert topo.link("d", "d2") == GpuLink(0, PcieLevel.SYSTEM)
    assert Topology({"a": 0, "c": 0}, {}).link("a", "c") == GpuLink(0, PcieLevel.NODE)
    assert topo.set_score(["a", "b", "c"]) == 250 + 10 + 10
    assert topo.links == {("a", "b"): GpuLink(2, PcieLevel.SINGLE)}


def test_topology_refuses_conflicting_and_self_links() -> None:
    with pytest.raises(ValueError, match="conflicting links between b and a"):
        Topology({}, {("a", "b"): SYS, ("b", "a"): GpuLink(1, PcieLevel.SYSTEM)})
    with pytest.raises(ValueError, match="link from GPU a to itself"):
        Topology({}, {("a", "a"): SYS})


class FakeLinks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        self.calls.append((uuid_a, uuid_b))
        return GpuLink(4, PcieLevel.NODE)


def test_topology_from_nvml_reads_each_pair_once() -> None:
    gpus = [full_gpu(i, numa_node=i // 2) for i in range(3)]
    fake = FakeLinks()
    topo = Topology.from_nvml(fake, gpus)
    assert fake.calls == [(U[0], U[1]), (U[0], U[2]), (U[1], U[2])]
    assert topo.numa_nodes == {U[0]: 0, U[1]: 0, U[2]: 1}
    assert topo.link(U[2], U[0]) == GpuLink(4, PcieLevel.NODE)


# -- whole GPUs: score first, then the tie-breaks --------------------------------------------------

NVL = GpuLink(4, PcieLevel.SYSTEM)
TWO_PAIRS = {(0, 1): NVL, (2, 3): NVL}


@pytest.mark.parametrize(
    ("numa", "links", "available", "must", "size", "want"),
    [
        pytest.param([0, 1, 1, 0], {(0, 1): NVL}, [0, 1, 2, 3], [], 2, [0, 1], id="score-beats-numa"),
        pytest.param([0, 1, 1, 0], {}, [0, 1, 2, 3], [], 2, [0, 3], id="fewest-numa-nodes"),
        pytest.param([0, 0, 1, 1], TWO_PAIRS, [1, 2, 3], [], 1, [1], id="fragmentation-takes-broken-pair"),
        pytest.param(
            [0, 0, 1, 1], TWO_PAIRS, [0, 1, 3], [], 1, [3], id="fragmentation-takes-partner-of-taken"
        ),
        pytest.param([0, 0, 0, 0], {}, [0, 1, 2, 3], [], 2, [0, 1], id="lowest-index"),
        pytest.param([0, 0, 1, 1], TWO_PAIRS, [0, 1, 2, 3], [2], 2, [2, 3], id="must-include-gets-partner"),
        pytest.param(
            [0, 0, 1, 1], TWO_PAIRS, [0, 1, 2, 3], [0, 2], 3, [0, 1, 2], id="two-musts-lowest-index"
        ),
        pytest.param([0, 0, 1, 1], TWO_PAIRS, [0, 1, 2, 3], [], 4, [0, 1, 2, 3], id="everything"),
    ],
)
def test_whole_gpu_choices(
    numa: list[int | None],
    links: dict[tuple[int, int], GpuLink],
    available: list[int],
    must: list[int],
    size: int,
    want: list[int],
) -> None:
    assert node(numa, links).preferred(ids(*available), ids(*must), size) == ids(*want)


def test_numa_tie_break_before_fragmentation_and_index() -> None:
    # {0, 3} and {1, 2} score the same; {0, 3} leaves the better-connected rest and has the lower
    # indices, but {1, 2} stays on one NUMA node.
    single = GpuLink(0, PcieLevel.SINGLE)
    links = {
        (0, 3): single,
        (1, 2): single,
        (1, 4): GpuLink(0, PcieLevel.NODE),
        (2, 4): GpuLink(0, PcieLevel.NODE),
    }
    assert node([0, 1, 1, 2, 3], links).preferred(ids(0, 1, 2, 3, 4), [], 2) == ids(1, 2)


def test_without_topology_devices_numa_nodes_decide() -> None:
    allocator = Allocator(gpu_devices(U[:4], [1, 0, 1, 0]))
    assert allocator.kind == "gpus"
    assert allocator.preferred(ids(0, 1, 2, 3), [], 2) == ids(0, 2)


def test_answer_is_in_device_order_whatever_the_request_order() -> None:
    allocator = node([0, 0, 1, 1], TWO_PAIRS)
    assert allocator.preferred(ids(3, 2, 1, 0), ids(3), 2) == ids(2, 3)


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        pytest.param(ids(0, 1), [], 0, "allocation_size must be at least 1, got 0", id="size-zero"),
        pytest.param(ids(0, 1), [], -1, "allocation_size must be at least 1, got -1", id="size-negative"),
        pytest.param(
            ids(0, 1, 2, 3), [], 5, "allocation_size 5 exceeds the 4 available devices", id="size-too-large"
        ),
        pytest.param(ids(2), [], 2, "allocation_size 2 exceeds the 1 available device", id="one-available"),
        pytest.param([], [], 1, "allocation_size 1 exceeds the 0 available devices", id="none-available"),
        pytest.param(
            [U[0], "GPU-x", "GPU-y"],
            [],
            1,
            "unknown device IDs in available: GPU-x, GPU-y",
            id="unknown-available",
        ),
        pytest.param(ids(0, 1), ["GPU-z"], 1, "unknown device IDs in must_include: GPU-z", id="unknown-must"),
        pytest.param(
            [f"x{i}" for i in range(12)],
            [],
            1,
            "unknown device IDs in available: x0, x1, x2, x3, x4, x5, x6, x7, x8, x9 (and 2 more)",
            id="many-unknown",
        ),
        pytest.param(
            ids(0, 1),
            ids(2, 0, 3),
            3,
            "must_include devices not in available: GPU-2, GPU-3",
            id="must-not-available",
        ),
        pytest.param(
            ids(0, 1, 2),
            ids(0, 1),
            1,
            "must_include has 2 devices, more than allocation_size 1",
            id="must-too-many",
        ),
        pytest.param(
            ids(0, 0, 1),
            [],
            3,
            "allocation_size 3 exceeds the 2 available devices",
            id="duplicates-count-once",
        ),
    ],
)
def test_request_errors(available: list[str], must: list[str], size: int, message: str) -> None:
    allocator = node([0, 0, 1, 1], TWO_PAIRS)
    with pytest.raises(RequestError) as caught:
        allocator.preferred(available, must, size)
    assert str(caught.value) == message


def test_duplicates_are_dropped_silently() -> None:
    allocator = node([0, 0, 1, 1], TWO_PAIRS)
    assert allocator.preferred(ids(2, 2, 3, 0), ids(2, 2), 2) == ids(2, 3)


def test_duplicate_device_ids_are_a_bug() -> None:
    with pytest.raises(ValueError, match="duplicate device IDs"):
        Allocator(gpu_devices([U[0], U[0]], [0, 0]))


# -- replicas --------------------------------------------------------------------------------------


def replicated(gpus: int, per_gpu: int) -> list[Device]:
    """`per_gpu` replicas of each of `gpus` whole GPUs, four GPUs to a NUMA node."""
    return [d for g in range(gpus) for d in replicas(full_gpu(g, numa_node=g // 4), per_gpu)]


def rid(gpu: int, n: int) -> str:
    return f"{U[gpu]}::{n}"


ALL_4x4 = [rid(g, n) for g in range(4) for n in range(4)]


@pytest.mark.parametrize(
    ("policy", "available", "must", "size", "want"),
    [
        pytest.param(
            AllocationPolicy.DISTRIBUTED, ALL_4x4, [], 3, [rid(0, 0), rid(1, 0), rid(2, 0)], id="spread-fresh"
        ),
        pytest.param(
            AllocationPolicy.DISTRIBUTED,
            [r for r in ALL_4x4 if r not in (rid(0, 0), rid(0, 1), rid(1, 0))],
            [],
            3,
            [rid(1, 1), rid(2, 0), rid(3, 0)],
            id="spread-least-used-first",
        ),
        pytest.param(
            AllocationPolicy.DISTRIBUTED,
            ALL_4x4,
            [rid(1, 2)],
            2,
            [rid(0, 0), rid(1, 2)],
            id="spread-must-counts-as-used",
        ),
        pytest.param(
            AllocationPolicy.DISTRIBUTED,
            [rid(0, 3), rid(1, 0), rid(1, 1), rid(1, 2), rid(1, 3)],
            [],
            3,
            [rid(1, 0), rid(1, 1), rid(1, 2)],
            id="spread-stays-on-the-free-gpu",
        ),
        pytest.param(
            AllocationPolicy.DISTRIBUTED,
            [rid(0, 0), rid(1, 2), rid(1, 3)],
            [],
            2,
            [rid(0, 0), rid(1, 2)],
            id="spread-tie-lowest",
        ),
        pytest.param(
            AllocationPolicy.DISTRIBUTED,
            ALL_4x4,
            [],
            6,
            [*ALL_4x4[0:2], *ALL_4x4[4:6], rid(2, 0), rid(3, 0)],
            id="spread-round-robin",
        ),
        pytest.param(
            AllocationPolicy.PACKED,
            [r for r in ALL_4x4 if r not in (rid(2, 0),)],
            [],
            3,
            [rid(2, 1), rid(2, 2), rid(2, 3)],
            id="pack-most-used-first",
        ),
        pytest.param(
            AllocationPolicy.PACKED, ALL_4x4, [], 6, [*ALL_4x4[0:6]], id="pack-fills-a-gpu-then-the-next"
        ),
    ],
)
def test_replica_policies(
    policy: AllocationPolicy, available: list[str], must: list[str], size: int, want: list[str]
) -> None:
    allocator = Allocator(replicated(4, 4), policy=policy)
    assert allocator.kind == "replicas"
    assert allocator.preferred(available, must, size) == want


def test_replicas_over_512_devices_spread_like_nvidia() -> None:
    allocator = Allocator(replicated(8, 64))
    available = [rid(g, n) for g in range(8) for n in range(64) if n >= g]  # GPU g has g replicas in use
    assert allocator.preferred(available, [], 3) == [rid(0, 0), rid(0, 1), rid(1, 1)]
    # NVIDIA's greedyAlloc (distributed): one at a time, from the GPU with the fewest replicas in
    # use, then the fewest taken by this request.
    used = list(range(8))
    picked = [0] * 8
    want = []
    for _ in range(40):
        gpu = min(range(8), key=lambda g: (used[g], picked[g], g))
        want.append(rid(gpu, used[gpu]))
        used[gpu] += 1
        picked[gpu] += 1
    assert allocator.preferred(available, [], 40) == sorted(want)


# -- MIG -------------------------------------------------------------------------------------------


def mig_devices(layout: list[tuple[int, int, int]]) -> list[Device]:
    """(gpu index, numa node, MIG devices) per parent GPU: 1g.5gb devices."""
    out = []
    for gpu, numa, count in layout:
        parent = full_gpu(gpu, numa_node=numa)
        out += [device(parent, mig_device_info(k, uuid=f"MIG-{gpu}-{k}")) for k in range(count)]
    return out


MIG_LAYOUT = [(0, 0, 7), (2, 0, 1), (5, 1, 2)]
MIG_ALL = [d.id for d in mig_devices(MIG_LAYOUT)]


MIG_NUMA = [(0, 0, 2), (5, 1, 2), (6, 1, 2)]
D, P = AllocationPolicy.DISTRIBUTED, AllocationPolicy.PACKED
# The kubelet's view: GPU 0 has 5 of its 7 MIG devices in use, GPU 2's one is in use.
MIG_PARTIAL = ["MIG-0-5", "MIG-0-6", "MIG-5-0", "MIG-5-1"]


@pytest.mark.parametrize(
    ("policy", "layout", "available", "must", "size", "want"),
    [
        pytest.param(D, MIG_LAYOUT, MIG_ALL, [], 1, ["MIG-0-0"], id="distributed-fresh-lowest"),
        pytest.param(
            D, MIG_LAYOUT, MIG_ALL, [], 3, ["MIG-0-0", "MIG-2-0", "MIG-5-0"], id="distributed-one-per-parent"
        ),
        pytest.param(
            D,
            MIG_LAYOUT,
            MIG_ALL,
            [],
            5,
            [*MIG_ALL[:2], "MIG-2-0", *MIG_ALL[-2:]],
            id="distributed-round-robin",
        ),
        pytest.param(
            D, MIG_LAYOUT, MIG_PARTIAL, [], 2, ["MIG-5-0", "MIG-5-1"], id="distributed-least-used-parent"
        ),
        pytest.param(
            D, MIG_LAYOUT, MIG_PARTIAL, [], 3, ["MIG-0-5", "MIG-5-0", "MIG-5-1"], id="distributed-then-next"
        ),
        pytest.param(
            D,
            MIG_LAYOUT,
            MIG_ALL,
            ["MIG-5-0"],
            2,
            ["MIG-0-0", "MIG-5-0"],
            id="distributed-must-counts-as-used",
        ),
        pytest.param(
            D,
            MIG_LAYOUT,
            MIG_PARTIAL,
            ["MIG-5-1"],
            3,
            ["MIG-0-5", "MIG-5-0", "MIG-5-1"],
            id="distributed-must-on-least-used",
        ),
        pytest.param(P, MIG_LAYOUT, MIG_ALL, [], 2, ["MIG-0-0", "MIG-0-1"], id="packed-fresh-fills-lowest"),
        pytest.param(
            P, MIG_LAYOUT, MIG_PARTIAL, [], 3, ["MIG-0-5", "MIG-0-6", "MIG-5-0"], id="packed-most-used-first"
        ),
        pytest.param(
            P, MIG_LAYOUT, MIG_ALL, ["MIG-5-0"], 2, ["MIG-5-0", "MIG-5-1"], id="packed-must-parent-first"
        ),
        pytest.param(
            P,
            MIG_LAYOUT,
            MIG_PARTIAL,
            ["MIG-5-0"],
            2,
            ["MIG-0-5", "MIG-5-0"],
            id="packed-most-used-beats-must-parent",
        ),
        pytest.param(
            P,
            MIG_NUMA,
            ["MIG-0-0", "MIG-0-1", "MIG-5-0", "MIG-5-1", "MIG-6-0"],
            ["MIG-6-0"],
            2,
            ["MIG-5-0", "MIG-6-0"],
            id="packed-tie-same-numa-node",
        ),
    ],
)
def test_mig_policies(
    policy: AllocationPolicy,
    layout: list[tuple[int, int, int]],
    available: list[str],
    must: list[str],
    size: int,
    want: list[str],
) -> None:
    allocator = Allocator(mig_devices(layout), policy=policy)
    assert allocator.kind == "mig"
    assert allocator.preferred(available, must, size) == want


def test_mig_default_is_distributed() -> None:
    assert Allocator(mig_devices(MIG_LAYOUT)).policy is AllocationPolicy.DISTRIBUTED
