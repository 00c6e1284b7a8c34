"""The RPC sections: Allocate and GetPreferredAllocation round trips against the floor, and the
plugin's peak RSS after that load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.budgets import ALLOCATE_BUDGET, PLUGIN_RSS_BUDGET_MB, PREFERRED_BUDGET, judge_ratio, remeasured
from bench.sampling import interleaved, run_calls
from bench.session import FLOOR, GPU, DeviceSetSpec, Session
from bench.table import MIB, Row, megabytes
from nvdp.api import pb
from nvdp.sim.kubelet import Kubelet
from testkit import ProcStats, write_node_file, write_time_slicing_config

DEVICES_PER_ALLOCATE = 4
PREFERRED_SIZES = (1, 2, 4, 8)


def device_sets(s: Session) -> list[DeviceSetSpec]:
    node64 = write_node_file(s.workdir / "node-64.yaml", 64)
    slicing = write_time_slicing_config(s.workdir / "time-slicing.yaml", 64)
    return [
        DeviceSetSpec("8 GPUs (dgx-a100)", "sim:dgx-a100"),
        DeviceSetSpec("64 GPUs (sim node file)", f"sim:{node64}"),
        DeviceSetSpec("512 replicas (dgx-a100, 64 each)", "sim:dgx-a100", slicing),
        DeviceSetSpec("512 replicas, /metrics on", "sim:dgx-a100", slicing, metrics=True),
    ]


def rpc_sections(s: Session) -> None:
    """Allocate on every device set (at concurrency 1 and 8; with --quick only 1 is timed, 8 is load),
    GetPreferredAllocation on the 512 replicas (not with --quick), peak RSS of each plugin after."""
    allocate = s.table.section(
        f"Allocate: 1 container x {DEVICES_PER_ALLOCATE} devices, round trip; ratio = nvdp p50 / floor p50"
    )
    preferred = (
        None
        if s.o.quick
        else s.table.section(
            "GetPreferredAllocation over 512 replicas, 128 taken;"
            " ratio = its p50 / Allocate p50 (same plugin, interleaved)"
        )
    )
    memory = s.table.section("peak RSS (VmHWM) after the Allocate load")
    for spec in device_sets(s):
        device_set(s, spec, allocate, preferred if spec.config and not spec.metrics else None, memory)


def device_set(
    s: Session, spec: DeviceSetSpec, allocate: list[Row], preferred: list[Row] | None, memory: list[Row]
) -> None:
    s.progress(f"Allocate: {spec.label}")
    with (
        Kubelet(s.fresh_dir("alloc"), workers=8) as kubelet,
        s.plugin(kubelet, spec) as nvdp,
        s.floor(kubelet) as floor,
    ):
        ids = list(kubelet.devices(GPU))
        per = DEVICES_PER_ALLOCATE
        requests = [
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(
                        devices_ids=[ids[(k * per + j) % len(ids)] for j in range(per)]
                    )
                ]
            )
            for k in range(len(ids))
        ]
        _check_allocate(kubelet, requests[0])
        stubs = {"floor": kubelet.stub(FLOOR), "nvdp": kubelet.stub(GPU)}

        def allocate_on(name: str) -> Callable[[int], object]:
            stub = stubs[name]
            return lambda i: stub.Allocate(requests[i % len(requests)], timeout=10)

        def against_floor(concurrency: int) -> list[Row]:
            samples = interleaved({n: allocate_on(n) for n in stubs}, s.o.calls, concurrency, s.o.rounds)
            case = f"Allocate, {spec.label}, c={concurrency}"
            floor_row = samples["floor"].row(case, "floor")
            nvdp_row = judge_ratio(
                samples["nvdp"].row(case, "nvdp"), samples["floor"].p50_ms(), ALLOCATE_BUDGET
            )
            return [floor_row, nvdp_row]

        allocate += remeasured(lambda: against_floor(1))
        if s.o.quick:  # the same load as the full run before the RSS is read, untimed
            run_calls(allocate_on("nvdp"), s.o.calls, 8)
        else:
            allocate += remeasured(lambda: against_floor(8))
        if preferred is not None:
            preferred_rows(s, ids, stubs, allocate_on("nvdp"), preferred)
        nvdp_mib = ProcStats.read(nvdp.pid).peak_rss_mib
        floor_mib = ProcStats.read(floor.pid).peak_rss_mib
        if not memory:
            memory.append(Row(f"floor process, {spec.label}", "floor", value=megabytes(floor_mib)))
        memory.append(
            Row(
                f"plugin process, {spec.label}",
                "nvdp",
                value=megabytes(nvdp_mib),
                budget=f"{PLUGIN_RSS_BUDGET_MB:.0f} MB",
                ok=nvdp_mib * MIB / 1e6 <= PLUGIN_RSS_BUDGET_MB,
            )
        )


def _check_allocate(kubelet: Kubelet, request: pb.AllocateRequest) -> None:
    """The benchmarked request is answered, with the devices asked for."""
    ids = list(request.container_requests[0].devices_ids)
    answer = kubelet.allocate(GPU, [ids]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
    expected = ",".join(dict.fromkeys(i.split("::")[0] for i in ids))
    if answer != expected:
        raise RuntimeError(f"nvdp answered NVIDIA_VISIBLE_DEVICES={answer!r}, expected {expected!r}")


def preferred_rows(
    s: Session,
    ids: list[str],
    stubs: dict[str, Any],
    allocate: Callable[[int], object],
    rows: list[Row],
) -> None:
    """Each size's GetPreferredAllocation calls run in rounds interleaved with the floor's and
    with Allocate calls on the same plugin: the ratio's two p50s come from the same minutes."""
    s.progress("GetPreferredAllocation over 512 replicas")
    taken_count = len(ids) // 4
    for size in PREFERRED_SIZES:
        requests = []
        for _ in range(16):
            taken = set(s.rng.sample(ids, taken_count))
            requests.append(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[i for i in ids if i not in taken], allocation_size=size
                        )
                    ]
                )
            )
        answer = stubs["nvdp"].GetPreferredAllocation(requests[0], timeout=10)
        if len(answer.container_responses[0].deviceIDs) != size:
            raise RuntimeError(f"GetPreferredAllocation answered {answer} for size {size}")

        def prefer_on(name: str, requests: list[Any] = requests) -> Callable[[int], object]:
            stub = stubs[name]
            return lambda index: stub.GetPreferredAllocation(requests[index % len(requests)], timeout=10)

        def against_allocate(size: int = size, requests: list[Any] = requests) -> list[Row]:
            calls = {n: prefer_on(n, requests) for n in stubs} | {"allocate": allocate}
            samples = interleaved(calls, s.o.preferred_calls, 1, s.o.rounds)
            case = f"GetPreferredAllocation, size {size}"
            row = samples["nvdp"].row(case, "nvdp")
            return [
                samples["floor"].row(case, "floor"),
                judge_ratio(row, samples["allocate"].p50_ms(), PREFERRED_BUDGET),
            ]

        rows += remeasured(against_allocate)
