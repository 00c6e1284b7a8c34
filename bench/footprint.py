"""The footprint beside NVIDIA's binaries (issue 27): the device plugin and the DRA kubelet plugin with
`--nvml real` over the C NVML stand-in (tests/nvml_standin, the mock library NVIDIA's binaries were
measured on: dgx-a100 for the plugin, dgx-a100-mig for the DRA plugin), and on the simulated node.

Rows: the peak RSS (VmHWM) of each after its start-up and load (the plugin: 200 Allocate calls), and
its idle CPU over the idle window (rescan at its default: 10 s for the plugin, 0.5 s for the DRA
plugin), with NVIDIA's numbers beside them. NVIDIA's were measured by issue 27 on another machine
(Go is not in this environment), so they are references, not a same-run ratio: idle CPU 0.18 % of a
core (device plugin) and 0.0 % (DRA plugin), peak RSS 32.6 MB and 58.5 MB. Budgets: idle CPU at most
NVIDIA's + 0.05 % of a core; peak RSS 45 MB (plugin) and 60 MB (DRA plugin) on the mock library.

The mock library's nvmlEventSetWait sleeps on a condition variable until an event is queued or its
timeout (no commands file here: no periodic check), as real NVML sleeps in the driver: its rows
measure nvdp over pynvml, not the stand-in. The simulated node's rows show nvdp's own cost.

Run alone: `python -m bench.footprint [--idle-seconds S]`; `python -m bench` includes it (full run).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # `python bench/footprint.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.budgets import DRA_IDLE_BUDGET_PCT, DRA_RSS_MOCK_BUDGET_MB, IDLE_BUDGET_PCT, PLUGIN_RSS_BUDGET_MB
from bench.rescan import mock_library
from bench.table import MIB, Row, megabytes
from nvdp.api import pb
from nvdp.kubelet_standin import Kubelet
from nvdp.testing import Process, ProcStats, sim_gpus, start_plugin, wait_until
from nvdp.testing.dra import dra_cluster, slices_of

GPU = "nvidia.com/gpu"
ALLOCATES = 200
NVIDIA = {"plugin": (0.18, 32.6), "dra": (0.0, 58.5)}  # idle % of a core, peak RSS MB (issue 27)


@contextlib.contextmanager
def _plugin(work: Path, nvml: str, env: dict[str, str]) -> Iterator[Process]:
    directory = work / "kubelet" / "device-plugins"  # a node's layout: nothing else changes around it
    directory.mkdir(parents=True)
    with Kubelet(directory) as kubelet:
        process = start_plugin(directory, nvml, env=env)
        try:
            kubelet.wait_for_registration(GPU, timeout=60)
            ids = list(kubelet.wait_for_devices(GPU, timeout=30))
            stub = kubelet.stub(GPU)
            for i in range(ALLOCATES):
                request = pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])
                stub.Allocate(pb.AllocateRequest(container_requests=[request]), timeout=10)
            yield process
        finally:
            process.stop()


@contextlib.contextmanager
def _dra(work: Path, nvml: str, env: dict[str, str]) -> Iterator[Process]:
    with dra_cluster(work, "sim:dgx-a100-mig", env=env) as cluster:
        cluster.nvml = nvml
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 30, "the ResourceSlices")
        yield process


def measure(idle_seconds: float, work: Path) -> list[Row]:
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        plugin_lib = mock_library(sim_gpus("dgx-a100"), _dir(work / "lib-plugin"))
        dra_lib = mock_library(sim_gpus("dgx-a100-mig"), _dir(work / "lib-dra"))
        started: list[tuple[str, str, Process]] = []
        for label, lib in (("mock library", (plugin_lib, dra_lib)), ("simulated node", ({}, {}))):
            if lib[0] is None or lib[1] is None:
                continue  # no C compiler: the mock library's rows are left out
            nvml = ("real", "real") if lib[0] else ("sim:dgx-a100", "sim:dgx-a100-mig")
            plugin = stack.enter_context(_plugin(_dir(work / f"p-{len(started)}"), nvml[0], lib[0]))
            started.append(("plugin", label, plugin))
            dra = stack.enter_context(_dra(_dir(work / f"d-{len(started)}"), nvml[1], lib[1]))
            started.append(("dra", label, dra))
        time.sleep(2.0)  # start-up work done
        before = {p.pid: ProcStats.read(p.pid) for _, _, p in started}
        cpu_before = {p.pid: _cpu_ns(p.pid) for _, _, p in started}
        t0 = time.monotonic()
        time.sleep(idle_seconds)
        elapsed = time.monotonic() - t0
        for what, label, process in started:
            after, start = ProcStats.read(process.pid), before[process.pid]
            nvidia_pct, nvidia_mb = NVIDIA[what]
            name = "device plugin" if what == "plugin" else "DRA kubelet plugin"
            pct = (_cpu_ns(process.pid) - cpu_before[process.pid]) / 1e7 / elapsed
            budget_pct = (IDLE_BUDGET_PCT if what == "plugin" else DRA_IDLE_BUDGET_PCT) + 0.0
            rows.append(
                Row(
                    f"{name}, {label}: idle CPU",
                    "nvdp",
                    f"{elapsed:.0f} s",
                    value=f"{pct:.3f}% core, {(after.switches - start.switches) / elapsed:.0f} wake-ups/s;"
                    f" NVIDIA's {nvidia_pct}%",
                    budget=f"{budget_pct:.2f}% core",
                    ok=pct <= budget_pct,
                )
            )
            peak_mb = after.peak_rss_mib * MIB / 1e6
            rss_budget = PLUGIN_RSS_BUDGET_MB if what == "plugin" else DRA_RSS_MOCK_BUDGET_MB
            rows.append(
                Row(
                    f"{name}, {label}: peak RSS",
                    "nvdp",
                    value=f"{megabytes(after.peak_rss_mib)}; NVIDIA's {nvidia_mb} MB",
                    budget=f"{rss_budget:.0f} MB" if label == "mock library" else "",
                    ok=peak_mb <= rss_budget if label == "mock library" else None,
                )
            )
    return rows


def _cpu_ns(pid: int) -> int:
    """CPU time of the process's threads in ns (schedstat: finer than the 10 ms clock ticks of
    /proc/PID/stat, which a 30 s window of 0.1 % of a core would count in threes)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def section(s: object) -> None:
    """`python -m bench`'s section (s: bench.session.Session; full run only)."""
    from bench.session import Session

    assert isinstance(s, Session)
    seconds = min(s.o.idle_seconds, 30.0)
    s.progress(f"footprint beside NVIDIA's: mock library and simulated node, idle {seconds:g} s")
    s.table.section(
        "footprint beside NVIDIA's binaries (issue 27's numbers, another machine): mock NVML library"
        " (C stand-in) and simulated node (bench/footprint.py)"
    ).extend(measure(seconds, s.fresh_dir("footprint")))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-fp-", dir="/tmp") as work:
        for row in measure(args.idle_seconds, Path(work)):
            print(f"{row.measurement}: {row.value} [budget {row.budget or '-'}: {row.ok}]")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
