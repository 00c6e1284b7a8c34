"""The footprint beside NVIDIA's binaries (issue 27): the device plugin and the DRA kubelet plugin with
`--nvml real` over the C NVML stand-in (tests/nvml_standin, the mock library NVIDIA's binaries were
measured on: dgx-a100 for the plugin, dgx-a100-mig for the DRA plugin), and on the simulated node.

Rows: the peak RSS (VmHWM) of each after its start-up and load (the plugin: 200 Allocate calls), and
its idle CPU over the idle window (rescan at its default: 10 s for the plugin, 0.5 s for the DRA
plugin), beside the bare grpcio device plugin's (bench/floor.py: what a Python gRPC server costs
idle before any plugin code) and NVIDIA's. NVIDIA's DRA numbers were measured by issue 27 on
another machine: idle CPU 0.0 % of a core, peak RSS 58.5 MB. Budgets: idle CPU at most NVIDIA's
+ 0.05 % of a core; peak RSS 45 MB (plugin) and 60 MB (DRA plugin) on the mock library.

The mock library's nvmlEventSetWait sleeps on a condition variable until an event is queued or its
timeout (no commands file here: no periodic check), as real NVML sleeps in the driver: its rows
measure nvdp over pynvml, not the stand-in. The simulated node's rows show nvdp's own cost.

NVIDIA's device plugin itself, where its binary is named (`--nvidia-plugin PATH` or the env var
NVDP_BENCH_NVIDIA_PLUGIN; built from NVIDIA's v0.20.0 sources with `go build -mod=vendor
./cmd/nvidia-device-plugin`), runs on the same mock library in the same minutes: a same-run ratio.
Its socket directory is fixed at /var/lib/kubelet/device-plugins, so it runs in a mount namespace of
its own where that path is the bench's directory (root and `unshare` needed; left out otherwise).

Run alone: `python -m bench.footprint [--idle-seconds S] [--nvidia-plugin PATH]`; `python -m bench`
includes it (full run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # `python bench/footprint.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.budgets import DRA_IDLE_BUDGET_PCT, DRA_RSS_MOCK_BUDGET_MB, IDLE_BUDGET_PCT, PLUGIN_RSS_BUDGET_MB
from bench.harness import start_floor
from bench.rescan import mock_library
from bench.session import FLOOR
from bench.table import MIB, Row, megabytes
from nvdp.api import pb
from nvdp.sim.kubelet import Kubelet
from testkit import Process, ProcStats, clean_env, sim_gpus, start_plugin, wait_until
from testkit.dra import dra_cluster, slices_of

GPU = "nvidia.com/gpu"
ALLOCATES = 200
NVIDIA = {"plugin": (0.18, 32.6), "dra": (0.0, 58.5)}  # idle % of a core, peak RSS MB (issue 27)
NVIDIA_PLUGIN_ENV = "NVDP_BENCH_NVIDIA_PLUGIN"  # the path of NVIDIA's nvidia-device-plugin binary
NVIDIA_SOCKET_DIR = "/var/lib/kubelet/device-plugins"  # fixed in NVIDIA's plugin


def nvidia_argv(binary: str | None, directory: Path) -> list[str] | None:
    """NVIDIA's plugin in a mount namespace where its socket directory is `directory` (None: no
    binary, not root, or no `unshare`); the shell execs it, so its pid is the plugin's."""
    if not binary or not Path(binary).is_file() or os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    script = (
        f'mount -t tmpfs tmpfs /var/lib && mkdir -p {NVIDIA_SOCKET_DIR} && mount --bind "$0" '
        f'{NVIDIA_SOCKET_DIR} && exec "$1" --kubelet-socket {NVIDIA_SOCKET_DIR}/kubelet.sock'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(directory), binary]


@contextlib.contextmanager
def _plugin(work: Path, nvml: str, env: dict[str, str], nvidia: str | None = None) -> Iterator[Process]:
    """nvdp's plugin, or NVIDIA's binary at `nvidia`, under the same kubelet stand-in and load."""
    directory = work / "kubelet" / "device-plugins"  # a node's layout: nothing else changes around it
    directory.mkdir(parents=True)
    with Kubelet(directory) as kubelet:
        argv = nvidia_argv(nvidia, directory)
        if argv is None:
            process = start_plugin(directory, nvml, env=env)
        else:
            process = Process(argv, directory / "plugin.log", clean_env(env))
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
def _floor(work: Path) -> Iterator[Process]:
    """The bare grpcio device plugin (bench/floor.py), registered and listed, then idle: what a Python
    gRPC server costs before any plugin code."""
    with Kubelet(work) as kubelet:
        process = start_floor(work / "floor.sock", kubelet.socket_path, FLOOR)
        try:
            kubelet.wait_for_registration(FLOOR, timeout=60)
            kubelet.wait_for_updates(FLOOR, 1, timeout=30)
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


def measure(idle_seconds: float, work: Path, nvidia_plugin: str | None = None) -> list[Row]:
    rows: list[Row] = []
    if nvidia_argv(nvidia_plugin, work) is None:
        nvidia_plugin = None
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
            if nvidia_plugin and lib[0]:  # NVIDIA's on the same mock library, the same minutes
                theirs = stack.enter_context(_plugin(_dir(work / "nvidia"), "", lib[0], nvidia_plugin))
                started.append(("nvidia", label, theirs))
        started.append(("floor", "no NVML", stack.enter_context(_floor(_dir(work / "floor")))))
        time.sleep(2.0)  # start-up work done
        before = {p.pid: ProcStats.read(p.pid) for _, _, p in started}
        cpu_before = {p.pid: _cpu_ns(p.pid) for _, _, p in started}
        t0 = time.monotonic()
        time.sleep(idle_seconds)
        elapsed = time.monotonic() - t0
        # (what, label) -> idle % of a core, wake-ups/s, peak RSS MiB
        seen: dict[tuple[str, str], tuple[float, float, float]] = {}
        for what, label, process in started:
            after, start = ProcStats.read(process.pid), before[process.pid]
            pct = (_cpu_ns(process.pid) - cpu_before[process.pid]) / 1e7 / elapsed
            wakeups = (after.switches - start.switches) / elapsed
            seen[what, label] = (pct, wakeups, after.peak_rss_mib)
        for what, label, _ in started:
            rows += _rows(what, label, seen, f"{elapsed:.0f} s")
    return rows


def _rows(
    what: str, label: str, seen: dict[tuple[str, str], tuple[float, float, float]], n: str
) -> list[Row]:
    """The idle CPU and peak RSS rows of one process; NVIDIA's measured beside it: a same-run ratio."""
    pct, wakeups, peak_mib = seen[what, label]
    peak_mb = peak_mib * MIB / 1e6
    if what == "floor":
        return [
            Row(
                "bare grpcio device plugin (bench/floor.py): idle CPU",
                "floor",
                n,
                value=f"{pct:.3f}% core, {wakeups:.0f} wake-ups/s (gRPC's own threads: no plugin code)",
            )
        ]
    if what == "nvidia":
        return [
            Row(
                f"NVIDIA's device plugin (v0.20.0 binary), {label}: idle CPU",
                "nvidia",
                n,
                value=f"{pct:.3f}% core, {wakeups:.0f} wake-ups/s",
            ),
            Row(
                f"NVIDIA's device plugin (v0.20.0 binary), {label}: peak RSS",
                "nvidia",
                value=megabytes(peak_mib),
            ),
        ]
    nvidia_pct, nvidia_mb = NVIDIA[what]
    cpu_said, rss_said = f"NVIDIA's {nvidia_pct}%", f"NVIDIA's {nvidia_mb} MB"
    theirs = seen.get(("nvidia", label)) if what == "plugin" else None
    if theirs is not None:  # the ratio in words: a row's ratio column is for ratio budgets
        times = f"{pct / theirs[0]:.1f}x" if theirs[0] > 0 else "-"
        cpu_said = f"this run's NVIDIA's {theirs[0]:.3f}% ({times})"
        rss_said = f"this run's NVIDIA's {theirs[2] * MIB / 1e6:.1f} MB ({peak_mib / theirs[2]:.2f}x)"
    name = "device plugin" if what == "plugin" else "DRA kubelet plugin"
    budget_pct = IDLE_BUDGET_PCT if what == "plugin" else DRA_IDLE_BUDGET_PCT
    rss_budget = PLUGIN_RSS_BUDGET_MB if what == "plugin" else DRA_RSS_MOCK_BUDGET_MB
    mock = label == "mock library"
    return [
        Row(
            f"{name}, {label}: idle CPU",
            "nvdp",
            n,
            value=f"{pct:.3f}% core, {wakeups:.0f} wake-ups/s; {cpu_said}",
            budget=f"{budget_pct:.2f}% core",
            ok=pct <= budget_pct,
        ),
        Row(
            f"{name}, {label}: peak RSS",
            "nvdp",
            value=f"{megabytes(peak_mib)}; {rss_said}",
            budget=f"{rss_budget:.0f} MB" if mock else "",
            ok=peak_mb <= rss_budget if mock else None,
        ),
    ]


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
    ).extend(measure(seconds, s.fresh_dir("footprint"), os.environ.get(NVIDIA_PLUGIN_ENV)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument(
        "--nvidia-plugin",
        default=os.environ.get(NVIDIA_PLUGIN_ENV),
        help=f"NVIDIA's nvidia-device-plugin binary, measured beside nvdp's (default: ${NVIDIA_PLUGIN_ENV})",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-fp-", dir="/tmp") as work:
        for row in measure(args.idle_seconds, Path(work), args.nvidia_plugin):
            print(f"{row.measurement}: {row.value} [budget {row.budget or '-'}: {row.ok}]")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
