"""The device rescan's CPU cost (`--device-rescan-interval`, nvdp.plugins.kubeletplugin.rescan).

Run alone: `python -m bench.rescan` prints the table.

Per simulated node (dgx-a100: 8 whole GPUs; dgx-a100-mig: 4 MIG GPUs with 14 MIG devices, 4 whole),
the CPU time (thread time, so other threads and processes do not count) of one rescan tick while
nothing changes, split into the layout query (`Nvml.mig_layout()`, the cheap query a tick makes) and
the rest (one comparison with the served layout), best of 5 runs of 2000 ticks; then the CPU per
minute at the default 10 s interval (6 ticks) and at 1 s. The full enumeration (`Nvml.gpus()`, what
a tick read before the cheap query, and what a change's apply still makes) is timed beside it. The
simulated node keeps its layout until an event changes it, so its idle tick is a lookup. The real
backend's own CPU (nvdp, pynvml, ctypes) is timed over the C NVML stand-in
(tests/nvml_standin/libnvidia-ml.c, built with `cc`; the same node shapes, its commands file off),
500 queries, best of 5, in a subprocess, and the NVML calls of one query counted there (each a
driver query a real node adds); the stand-in answers from memory, so the driver's share is not in
it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.kubeletplugin.rescan import LayoutRescanner

TICKS = 2000
RUNS = 5


@dataclass(frozen=True)
class Row:
    node: str
    gpus: int
    mig_devices: int
    enumerate_us: float
    compare_us: float
    per_minute_10s_ms: float
    per_minute_1s_ms: float
    nvml_calls: int | None  # one tick's layout query on the real backend
    full_enumeration_us: float = 0.0  # `Nvml.gpus()`, for comparison (a change's apply)
    full_nvml_calls: int | None = None
    real_query_us: float | None = None  # the real backend's layout query over the C stand-in
    real_full_us: float | None = None  # its full enumeration


def _cpu_us(fn: Callable[[], object], ticks: int = TICKS) -> float:
    best = float("inf")
    for _ in range(RUNS):
        start = time.thread_time()
        for _ in range(ticks):
            fn()
        best = min(best, time.thread_time() - start)
    return best / ticks * 1e6


def measure(profile: str) -> Row:
    nvml = open_nvml(f"sim:{profile}")
    nvml.init()
    try:
        served = nvml.gpus()
        requests: list[None] = []
        scan = LayoutRescanner(nvml.mig_layout, lambda: served, lambda: requests.append(None), 10.0)
        tick_us = _cpu_us(scan.check)
        query_us = _cpu_us(nvml.mig_layout)
        full_us = _cpu_us(nvml.gpus)
        assert not requests, "no change: no rescan request"
    finally:
        nvml.shutdown()
    real_query_us, real_full_us, calls, full_calls = _standin_cpu_us(served) or (None, None, None, None)
    return Row(
        profile,
        len(served),
        sum(len(g.mig_devices) for g in served),
        query_us,
        max(0.0, tick_us - query_us),
        tick_us * 6 / 1000,
        tick_us * 60 / 1000,
        calls,
        full_us,
        full_calls,
        real_query_us,
        real_full_us,
    )


A100_GI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # GPU instance slices -> profile id on an A100


_STANDIN_SCRIPT = """
import json, time
import pynvml
calls = [0]
def counted(fn):
    def call(*args):
        calls[0] += 1
        return fn(*args)
    return call
for name in dir(pynvml):
    if name.startswith("nvml") and callable(getattr(pynvml, name)):
        setattr(pynvml, name, counted(getattr(pynvml, name)))
from nvdp.node.nvml.real import RealNvml
nvml = RealNvml(pynvml=pynvml, sysfs_root="/nonexistent")
nvml.init()
nvml.gpus()  # the first one fills the backend's caches (bus ids, profile ids)
calls[0] = 0
nvml.mig_layout()
layout_calls, calls[0] = calls[0], 0
nvml.gpus()
full_calls = calls[0]
def cpu_us(fn, n=500):
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, time.thread_time() - start)
    return best / n * 1e6
print(json.dumps([cpu_us(nvml.mig_layout), cpu_us(nvml.gpus), layout_calls, full_calls]))
"""


def _standin_node(gpus: list[GpuInfo]) -> str:
    """The C stand-in's node file for an enumerated node (A100 GPU instance profile ids)."""
    lines = ["driver 550.54.15", "cuda 12040"]
    for g in gpus:
        mode = (1 if g.mig_enabled else 0) if g.mig_capable else -1
        numa = -1 if g.numa_node is None else g.numa_node
        lines.append(
            f"gpu uuid={g.uuid} minor={g.minor} memory_mib={g.memory_mib} bus={g.pci_bus_id} "
            f"numa={numa} mig={mode} name={g.name}"
        )
    for g in gpus:
        for m in g.mig_devices:
            slices = int(m.profile.split("g.")[0].split(".")[-1])
            lines.append(
                f"mig gpu={g.index} uuid={m.uuid} gi={m.gi_id} ci={m.ci_id} gi_slices={slices} "
                f"ci_slices={slices} memory_mb={m.memory_bytes >> 20} profile={A100_GI_PROFILE_IDS[slices]}"
            )
    return "\n".join(lines) + "\n"


def mock_library(gpus: list[GpuInfo], directory: Path) -> dict[str, str] | None:
    """The C NVML stand-in built into `directory` as `libnvidia-ml.so.1` for a node of `gpus`: the env
    vars that make `--nvml real` load it (None without a C compiler, or when it does not build)."""
    source = Path(__file__).parent.parent / "tests" / "nvml_standin" / "libnvidia-ml.c"
    compiler = shutil.which("cc")
    if compiler is None or not source.exists():
        return None
    library = directory / "libnvidia-ml.so.1"
    node = directory / "node.txt"
    node.write_text(_standin_node(gpus))
    build = [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source), "-lpthread"]
    try:
        subprocess.run(build, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"LD_LIBRARY_PATH": str(directory), "NVML_STANDIN_NODE": str(node)}


def _standin_cpu_us(gpus: list[GpuInfo]) -> tuple[float, float, int, int] | None:
    """CPU µs and NVML calls of one layout query and of one full enumeration by the real backend
    (pynvml over the C stand-in), or None without a C compiler or when it cannot run."""
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-standin-") as tmp:
        library_env = mock_library(gpus, Path(tmp))
        if library_env is None:
            return None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **library_env}
        try:
            done = subprocess.run(
                [sys.executable, "-c", _STANDIN_SCRIPT],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
                cwd=Path(__file__).parent.parent,
            )
        except (OSError, subprocess.SubprocessError):
            return None
    query_us, full_us, calls, full_calls = json.loads(done.stdout)
    return float(query_us), float(full_us), int(calls), int(full_calls)


def rows() -> list[Row]:
    return [measure(p) for p in ("dgx-a100", "dgx-a100-mig")]


def format_table(table: list[Row]) -> str:
    lines = [
        "| node | GPUs | MIG devices | layout query µs/tick | compare µs/tick | CPU ms/min @10s "
        "| CPU ms/min @1s | NVML calls/tick (real backend) | full enumeration µs, NVML calls "
        "| real backend µs/tick over the C stand-in: layout query, full enumeration |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        calls = "-" if r.nvml_calls is None else str(r.nvml_calls)
        full_calls = "-" if r.full_nvml_calls is None else str(r.full_nvml_calls)
        real = (
            "-"
            if r.real_query_us is None or r.real_full_us is None
            else f"{r.real_query_us:.0f}, {r.real_full_us:.0f}"
        )
        lines.append(
            f"| {r.node} | {r.gpus} | {r.mig_devices} | {r.enumerate_us:.0f} | {r.compare_us:.0f} | "
            f"{r.per_minute_10s_ms:.2f} | {r.per_minute_1s_ms:.2f} | {calls} | "
            f"{r.full_enumeration_us:.0f}, {full_calls} | {real} |"
        )
    return "\n".join(lines)


def main() -> None:
    print(format_table(rows()))


if __name__ == "__main__":
    main()
