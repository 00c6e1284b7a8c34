"""What only the benchmarks run: the bare grpcio floor plugin as a process, the bytecode the measured
processes load, and the machine lines.

The plugin process, /proc readings and device-set files live in `testkit` (shared with the
tests, which never import this package).
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

from testkit import REPO, Process, clean_env

__all__ = ["compile_bytecode", "machine_lines", "start_floor"]


def compile_bytecode() -> None:
    """Write the bytecode of nvdp and bench (`__pycache__`, where missing or stale), as the image's
    `pip install` does for nvdp: a process start then costs what it costs on a node, not Python
    compiling every module from source, which PYTHONDONTWRITEBYTECODE (set in the image, and often
    where the tests run) would make each start of an editable checkout do (about 100 ms and 1 MB of
    peak RSS for `nvdp plugin` on 2 cores)."""
    for package in ("nvdp", "bench"):
        if not compileall.compile_dir(REPO / package, quiet=1):
            raise RuntimeError(f"compiling {REPO / package} failed")


def start_floor(
    socket_path: Path,
    kubelet_socket: Path,
    resource: str,
    *,
    devices: int = 8,
    workers: int = 32,
    log_path: Path | None = None,
) -> Process:
    """The bare grpcio floor plugin (bench.floor) as a process; it registers `resource` itself."""
    argv = [
        sys.executable,
        "-m",
        "bench.floor_serve",
        "--socket",
        str(socket_path),
        "--kubelet-socket",
        str(kubelet_socket),
        "--resource",
        resource,
        "--devices",
        str(devices),
        "--workers",
        str(workers),
    ]
    return Process(argv, log_path or socket_path.parent / "floor.log", clean_env())


def machine_lines() -> list[str]:
    """Where the numbers come from: CPUs, CPU model, Python and grpcio versions, kernel."""
    import platform

    import grpc

    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0))
    return [
        f"machine: {cpus} CPUs (nproc), {model}; Linux {platform.release()}",
        f"python:  {platform.python_implementation()} {platform.python_version()}, grpcio {grpc.__version__}",
    ]
