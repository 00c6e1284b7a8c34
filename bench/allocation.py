"""GetPreferredAllocation: answer time and answer quality.

Run alone: `python -m bench.allocation` prints the tables. `rows()` returns them for bench/run.py.

Time: p50/p99 of `Allocator.preferred` (validation included; per request the best of 3 runs) over
a seeded request mix (every size, random GPUs already taken, half the requests with one
must_include) on the simulated dgx-a100 and dgx-h100 nodes, 16-GPU synthetic nodes, a simulated
64-GPU node file, 512 replicas and 56 MIG devices; plus the 16-GPU NVLink-pair node by size.
Quality: against brute force (every set ranked by score, NUMA nodes, leftover score, indices) for
every size and every must_include of size <= 1 on the simulated profiles, all GPUs free and every
subset of free GPUs; and the heuristic (used beyond 16 GPUs) forced on 16-GPU nodes against exact.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import combinations
from pathlib import Path

from nvdp.node.gpus.devices import Device
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuLink, MigDeviceInfo, PcieLevel
from nvdp.plugins.deviceplugin.allocation import Allocator, Topology, pair_score
from nvdp.plugins.deviceplugin.allocation.gpus import choose_gpus
from testkit.synthetic import gpu_devices, hierarchical_node

PROFILES = ("pcie-4", "dgx-a100", "dgx-h100")


def pairs_16() -> tuple[list[Device], Topology]:
    """16 GPUs, 2 NUMA nodes, NVLink-bridged pairs (4 links), PCIe switch pairs under quad switches."""
    return hierarchical_node(16, per_numa=8, per_switch=2, nvlink_group=2, nvlinks=4)


def nvswitch_16() -> tuple[list[Device], Topology]:
    """16 GPUs, 2 NUMA nodes, every pair 18 NVLinks through NVSwitches (HGX-2 like)."""
    return hierarchical_node(16, per_numa=8, per_switch=2, nvlink_group=16, nvlinks=18)


@dataclass(frozen=True)
class TimeRow:
    case: str
    devices: int
    requests: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class QualityRow:
    case: str
    requests: int
    optimal_score: int  # answers whose set score equals the brute-force maximum
    same_answer: int  # answers equal to the brute-force answer under every tie-break


Request = tuple[list[str], list[str], int]


# -- nodes ----------------------------------------------------------------------------------------


def sim_node(spec: str) -> tuple[list[Device], Topology]:
    nvml = open_nvml(spec)
    nvml.init()
    try:
        gpus = nvml.gpus()
        topology = Topology.from_nvml(nvml, gpus)
    finally:
        nvml.shutdown()
    return gpu_devices([g.uuid for g in gpus], [g.numa_node for g in gpus]), topology


def node_file_64(directory: Path) -> Path:
    """A simulated 64-GPU node: 4 NUMA nodes of 16, islands of 8 GPUs joined by 12 NVLinks each,
    PCIe switch pairs (SINGLE) under quad switches (MULTIPLE)."""
    lines = ["gpus:", "  - {name: NVIDIA H100 80GB HBM3, count: 64, numa_nodes: 4}", "nvlinks:"]
    for a, b in combinations(range(64), 2):
        if a // 8 == b // 8:
            lines.append(f"  - {{gpus: [{a}, {b}], links: 12}}")
    lines.append("pcie:")
    lines += [f"  - {{gpus: [{q}, {q + 1}, {q + 2}, {q + 3}], level: MULTIPLE}}" for q in range(0, 64, 4)]
    lines += [f"  - {{gpus: [{p}, {p + 1}], level: SINGLE}}" for p in range(0, 64, 2)]
    path = directory / "node-64.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def random_node(count: int, seed: int) -> tuple[list[Device], Topology]:
    rng = random.Random(seed)
    uuids = [f"GPU-{i:02d}" for i in range(count)]
    numa: list[int | None] = [i * 2 // count for i in range(count)]
    links = {
        (a, b): GpuLink(rng.choice([0, 0, 0, 1, 2, 4, 12]), rng.choice(list(PcieLevel)))
        for a, b in combinations(uuids, 2)
    }
    return gpu_devices(uuids, numa), Topology(dict(zip(uuids, numa, strict=True)), links)


def replica_devices(gpus: int, per_gpu: int) -> list[Device]:
    whole = gpu_devices([f"GPU-{i:02d}" for i in range(gpus)], [i * 2 // gpus for i in range(gpus)])
    return [replace(g, id=f"{g.uuid}::{n}", replica=n) for g in whole for n in range(per_gpu)]


def mig_devices(gpus: int, per_gpu: int) -> list[Device]:
    out = []
    for g in range(gpus):
        for k in range(per_gpu):
            uuid = f"MIG-{g:02d}-{k}"
            info = MigDeviceInfo(uuid, k, 7 + k, 0, "1g.10gb", 10 << 30, f"GPU-{g:02d}", g)
            out.append(
                Device(uuid, uuid, f"{g}:{k}", f"GPU-{g:02d}", g, g * 2 // gpus, (), 10 << 30, mig=info)
            )
    return out


# -- time -----------------------------------------------------------------------------------------


def request_mix(
    ids: Sequence[str], rng: random.Random, per_size: int, sizes: Sequence[int] | None = None
) -> Iterator[Request]:
    """For each size, `per_size` requests with a random part of the devices taken, half with one
    must_include."""
    for size in sizes or range(1, len(ids) + 1):
        for _ in range(per_size):
            taken = rng.randint(0, len(ids) - size)
            available = sorted(rng.sample(list(ids), len(ids) - taken))
            must = [rng.choice(available)] if rng.random() < 0.5 else []
            yield available, must, size


def timed(
    case: str, allocator: Allocator, requests: Sequence[Request], devices: int, repeats: int = 3
) -> TimeRow:
    """Per request, the best of `repeats` runs (so that a busy machine's preemptions stay out)."""
    times = []
    for available, must, size in requests:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            allocator.preferred(available, must, size)
            best = min(best, time.perf_counter() - start)
        times.append(best * 1e3)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return TimeRow(case, devices, len(times), statistics.median(times), p99, times[-1])


def time_rows(rng: random.Random) -> list[TimeRow]:
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [
            ("dgx-a100 (sim)", sim_node("sim:dgx-a100"), 100),
            ("dgx-h100 (sim)", sim_node("sim:dgx-h100"), 100),
            ("16 GPUs, NVLink pairs", pairs_16(), 60),
            ("16 GPUs, NVSwitch", nvswitch_16(), 60),
            ("16 GPUs, random links", random_node(16, seed=16), 60),
            ("64 GPUs, 8 NVLink islands (sim file)", sim_node(f"sim:{node_file_64(Path(tmp))}"), 10),
        ]
    rows = []
    for case, (devices, topology), per_size in nodes:
        requests = list(request_mix([d.id for d in devices], rng, per_size))
        rows.append(timed(case, Allocator(devices, topology), requests, len(devices)))
    sharing = [
        ("512 replicas (8 GPUs x 64)", replica_devices(8, 64)),
        ("56 MIG devices (8 x 7)", mig_devices(8, 7)),
    ]
    for case, devices in sharing:
        requests = list(request_mix([d.id for d in devices], rng, 100, sizes=[1, 2, 3, 4, 8, 16]))
        rows.append(timed(case, Allocator(devices), requests, len(devices)))
    return rows


def size_rows(rng: random.Random) -> list[TimeRow]:
    devices, topology = pairs_16()
    allocator = Allocator(devices, topology)
    ids = [d.id for d in devices]
    return [
        timed(f"16 GPUs, NVLink pairs, size {size}", allocator, list(request_mix(ids, rng, 60, [size])), 16)
        for size in range(1, 17)
    ]


# -- quality --------------------------------------------------------------------------------------


def brute_force(
    topology: Topology, uuids: Sequence[str], available: Sequence[int], must: Sequence[int], size: int
) -> tuple[int, list[int]]:
    """(best score, best set) under score, then NUMA nodes, then leftover score, then indices."""
    ranked = []
    for chosen in combinations(available, size):
        if not set(must) <= set(chosen):
            continue
        rest = [uuids[i] for i in available if i not in chosen]
        nodes = len({topology.numa_nodes.get(uuids[i]) for i in chosen})
        score = topology.set_score(uuids[i] for i in chosen)
        ranked.append((-score, nodes, -topology.set_score(rest), list(chosen)))
    best = min(ranked)
    return -best[0], best[3]


def quality(
    case: str,
    topology: Topology,
    uuids: list[str],
    answer: Callable[[list[int], list[int], int], list[int]],
    subsets: bool,
) -> QualityRow:
    count = optimal = same = 0
    n = len(uuids)
    free_sets = (
        [list(s) for k in range(1, n + 1) for s in combinations(range(n), k)] if subsets else [list(range(n))]
    )
    for available in free_sets:
        for size in range(1, len(available) + 1):
            for must in [[], *([i] for i in available)]:
                best_score, best = brute_force(topology, uuids, available, must, size)
                got = answer(available, must, size)
                count += 1
                optimal += topology.set_score(uuids[i] for i in got) == best_score
                same += got == best
    return QualityRow(case, count, optimal, same)


def quality_rows() -> list[QualityRow]:
    rows = []
    for name in PROFILES:
        devices, topology = sim_node(f"sim:{name}")
        uuids = [d.uuid for d in devices]
        allocator = Allocator(devices, topology)

        def answer(available: list[int], must: list[int], size: int) -> list[int]:
            got = allocator.preferred([uuids[i] for i in available], [uuids[i] for i in must], size)  # noqa: B023
            return [uuids.index(u) for u in got]  # noqa: B023

        rows.append(quality(f"{name}: all free", topology, uuids, answer, subsets=False))
        rows.append(quality(f"{name}: every free subset", topology, uuids, answer, subsets=True))
    rows.append(heuristic_vs_exact("heuristic on 16 GPUs, NVLink pairs", *pairs_16()))
    rows.append(heuristic_vs_exact("heuristic on 16 GPUs, NVSwitch", *nvswitch_16()))
    rows.append(heuristic_vs_exact("heuristic on 16 GPUs, random links", *random_node(16, seed=16)))
    return rows


def heuristic_vs_exact(case: str, devices: list[Device], topology: Topology) -> QualityRow:
    """The heuristic (forced) against the exact search, every size and must_include of size <= 1."""
    uuids = [d.uuid for d in devices]
    n = len(uuids)
    weights = [[0 if a == b else pair_score(topology.link(a, b)) for b in uuids] for a in uuids]
    numa = [topology.numa_nodes.get(u) or 0 for u in uuids]
    count = optimal = same = 0
    for size in range(1, n + 1):
        for must in [[], *([i] for i in range(n))]:
            exact = choose_gpus(weights, numa, list(range(n)), must, size)
            heuristic = choose_gpus(weights, numa, list(range(n)), must, size, exact_max_gpus=0)
            count += 1
            optimal += topology.set_score(uuids[i] for i in heuristic) == topology.set_score(
                uuids[i] for i in exact
            )
            same += heuristic == exact
    return QualityRow(case, count, optimal, same)


# -- report ---------------------------------------------------------------------------------------


def rows(seed: int = 0) -> list[dict[str, object]]:
    """Every row as a dict: {"table": "allocation time" | "allocation time by size" |
    "allocation quality", ...the row's fields}."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = [{"table": "allocation time", **asdict(r)} for r in time_rows(rng)]
    out += [{"table": "allocation time by size", **asdict(r)} for r in size_rows(rng)]
    out += [{"table": "allocation quality", **asdict(r)} for r in quality_rows()]
    return out


def format_table(all_rows: list[dict[str, object]]) -> str:
    lines: list[str] = []
    for table in dict.fromkeys(str(r["table"]) for r in all_rows):
        body = [r for r in all_rows if r["table"] == table]
        lines.append(f"== {table}")
        if table == "allocation quality":
            lines.append(f"{'case':<42} {'optimal score':>15} {'same answer':>15}")
            for r in body:
                optimal, same = f"{r['optimal_score']}/{r['requests']}", f"{r['same_answer']}/{r['requests']}"
                lines.append(f"{r['case']!s:<42} {optimal:>15} {same:>15}")
        else:
            lines.append(
                f"{'case':<42} {'devices':>7} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
            )
            for r in body:
                lines.append(
                    f"{r['case']!s:<42} {r['devices']!s:>7} {r['requests']!s:>8} "
                    f"{r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f}"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    print(format_table(rows()))


if __name__ == "__main__":
    main()
