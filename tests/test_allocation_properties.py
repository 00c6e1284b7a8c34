"""Property tests: on random topologies the answer is the brute-force optimum under the full order."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.node.gpus.devices import Device
from nvdp.node.nvml.types import GpuLink, PcieLevel
from nvdp.plugins.deviceplugin.allocation import Allocator, Topology
from testkit.synthetic import gpu_devices
from tests.builders import device, full_gpu

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Case:
    uuids: list[str]
    numa: list[int | None]
    topology: Topology
    available: list[int]
    must: list[int]
    size: int


@st.composite
def cases(draw: st.DrawFn, min_gpus: int = 1, max_gpus: int = 8) -> Case:
    n = draw(st.integers(min_gpus, max_gpus))
    uuids = [f"GPU-{i:02d}" for i in range(n)]
    numa = draw(st.lists(st.sampled_from([0, 1, 2, None]), min_size=n, max_size=n))
    links = {}
    for a, b in combinations(range(n), 2):
        nvlinks = draw(st.sampled_from([0, 0, 0, 1, 2, 4, 12]))
        links[(uuids[a], uuids[b])] = GpuLink(nvlinks, draw(st.sampled_from(list(PcieLevel))))
    available = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1)))
    size = draw(st.integers(1, len(available)))
    must = sorted(draw(st.sets(st.sampled_from(available), max_size=size)))
    return Case(uuids, numa, Topology(dict(zip(uuids, numa, strict=True)), links), available, must, size)


def brute_force(case: Case) -> list[int]:
    """Every candidate set, ranked by score, NUMA nodes, score of the leftovers, indices."""
    topo, uuids = case.topology, case.uuids
    ranked = []
    for chosen in combinations(case.available, case.size):
        if not set(case.must) <= set(chosen):
            continue
        rest = [uuids[i] for i in case.available if i not in chosen]
        score = topo.set_score(uuids[i] for i in chosen)
        nodes = len({case.numa[i] for i in chosen})
        ranked.append((-score, nodes, -topo.set_score(rest), list(chosen)))
    return min(ranked)[3]


def answer(case: Case) -> list[int]:
    allocator = Allocator(gpu_devices(case.uuids, case.numa), case.topology)
    got = allocator.preferred(
        [case.uuids[i] for i in case.available], [case.uuids[i] for i in case.must], case.size
    )
    return [case.uuids.index(u) for u in got]


@SETTINGS
@given(cases())
def test_answer_is_a_valid_set_with_the_brute_force_optimum_score(case: Case) -> None:
    got = answer(case)
    assert len(got) == case.size == len(set(got))
    assert set(got) <= set(case.available)
    assert set(case.must) <= set(got)
    best = brute_force(case)
    score = case.topology.set_score
    assert score(case.uuids[i] for i in got) == score(case.uuids[i] for i in best)
    assert got == best  # and every tie-break agrees


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(min_gpus=9, max_gpus=11))
def test_exact_on_larger_nodes(case: Case) -> None:
    assert answer(case) == brute_force(case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(min_gpus=17, max_gpus=24))
def test_heuristic_beyond_16_gpus_answers_a_valid_set(case: Case) -> None:
    got = answer(case)
    assert len(got) == case.size == len(set(got))
    assert set(case.must) <= set(got) <= set(case.available)


@st.composite
def replica_requests(draw: st.DrawFn) -> tuple[list[Device], list[str], list[str], int]:
    per_gpu = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    devices = [device(full_gpu(g), replica=n) for g, count in enumerate(per_gpu) for n in range(count)]
    available = draw(st.lists(st.sampled_from([d.id for d in devices]), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    return devices, available, must, size


@SETTINGS
@given(replica_requests())
def test_replica_spread_is_valid_and_balanced(
    request: tuple[list[Device], list[str], list[str], int],
) -> None:
    devices, available, must, size = request
    got = Allocator(devices).preferred(available, must, size)
    assert len(got) == size == len(set(got))
    assert set(must) <= set(got) <= set(available)
    # Spread: a GPU left with free replicas is never more used than a GPU an extra replica came from,
    # counting the replica itself (in use = not available, or taken by this answer).
    totals: dict[str, int] = {}
    for d in devices:
        totals[d.uuid] = totals.get(d.uuid, 0) + 1
    free_before = {u: sum(1 for a in available if a.startswith(u + "::") and a not in must) for u in totals}
    taken = {u: sum(1 for a in got if a.startswith(u + "::") and a not in must) for u in totals}
    for u in totals:
        if taken[u] == 0:
            continue
        used_before_last = totals[u] - free_before[u] + taken[u] - 1
        for v in totals:
            if free_before[v] - taken[v] > 0:
                assert totals[v] - free_before[v] + taken[v] >= used_before_last
