"""Plugins as real processes, and what /proc says about them: used by bench/run.py and the soak tests.

`start_plugin(...)` runs `python -m nvdp.cli plugin` with the simulated NVML backend and a clean
environment (no inherited plugin flags or env vars); `start_floor(...)` runs the bare grpcio floor
plugin (`bench.floor_serve`). Both write stderr to a file (a pipe could fill up and block the
process) and are stopped with SIGTERM, then SIGKILL. `ProcStats` reads VmHWM, threads, fds and CPU
time of a pid. `write_node_file` and `write_time_slicing_config` make the large device sets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# Env vars that would change what the plugin does; the child never inherits them.
_PLUGIN_ENV_PREFIXES = ("NVDP_", "DP_")
_PLUGIN_ENV_NAMES = ("NODE_NAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.005) -> T:
    """Poll `predicate` until it returns something truthy (and return that); TimeoutError naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(interval)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ less every variable the plugin reads, plus PYTHONPATH for this checkout."""
    from nvdp.config import OPTIONS

    option_envs = {env for option in OPTIONS for env in option.envs}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in option_envs and k not in _PLUGIN_ENV_NAMES and not k.startswith(_PLUGIN_ENV_PREFIXES)
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """A child process whose stderr goes to `log_path`."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.started = time.monotonic()
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=REPO, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit status. Idempotent."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait()

    def kill(self) -> int:
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def plugin_argv(
    kubelet_socket: Path,
    nvml: str = "sim:dgx-a100",
    *,
    config_file: Path | None = None,
    metrics_address: str = "",
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [sys.executable, "-m", "nvdp.cli", "plugin", "--nvml", nvml]
    argv += ["--kubelet-socket", str(kubelet_socket), "--metrics-address", metrics_address]
    if config_file is not None:
        argv += ["--config-file", str(config_file)]
    return argv + list(extra)


def start_plugin(
    plugin_dir: Path,
    nvml: str = "sim:dgx-a100",
    *,
    config_file: Path | None = None,
    metrics_address: str = "",
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    log_path: Path | None = None,
) -> Process:
    """`nvdp plugin` serving `plugin_dir/nvidia-<name>.sock`, registering with `plugin_dir/kubelet.sock`."""
    argv = plugin_argv(
        plugin_dir / "kubelet.sock",
        nvml,
        config_file=config_file,
        metrics_address=metrics_address,
        extra=extra,
    )
    return Process(argv, log_path or plugin_dir / "plugin.log", clean_env(env))


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


# ---- /proc ----------------------------------------------------------------------------------------

_CLOCK_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStats:
    """One reading of a process: memory (MiB), threads, fds, CPU seconds, context switches."""

    peak_rss_mib: float  # VmHWM
    rss_mib: float  # VmRSS
    threads: int
    fds: int
    cpu_s: float  # utime + stime
    switches: int  # voluntary + involuntary context switches of every thread (wake-ups)

    @classmethod
    def read(cls, pid: int) -> ProcStats:
        status = _status(f"/proc/{pid}/status")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICK  # utime, stime (fields 14, 15)
        switches = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                t = _status(f"/proc/{pid}/task/{task}/status")
            except FileNotFoundError:
                continue
            switches += int(t.get("voluntary_ctxt_switches", 0)) + int(t.get("nonvoluntary_ctxt_switches", 0))
        return cls(
            peak_rss_mib=_kib(status["VmHWM"]) / 1024,
            rss_mib=_kib(status["VmRSS"]) / 1024,
            threads=int(status["Threads"]),
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            cpu_s=cpu,
            switches=switches,
        )


def _status(path: str) -> dict[str, str]:
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _kib(value: str) -> int:
    return int(value.split()[0])


def thread_names(pid: int) -> list[str]:
    """The kernel's name (comm) of every thread of `pid`, sorted."""
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
        except FileNotFoundError:
            continue
    return sorted(names)


# ---- device sets ----------------------------------------------------------------------------------


def write_node_file(path: Path, gpus: int = 64) -> Path:
    """A simulated node of `gpus` H100s on 4 NUMA nodes, every pair joined by 18 NVLinks (NVSwitch)."""
    path.write_text(
        f"# {gpus} simulated GPUs for the benchmarks and soak tests\n"
        "gpus:\n"
        f"  - {{name: NVIDIA H100 80GB HBM3, count: {gpus}, numa_nodes: 4}}\n"
        "nvswitch: 18\n"
    )
    return path


def write_time_slicing_config(path: Path, replicas: int = 64, extra: str = "") -> Path:
    """A v1 config: every GPU shared `replicas` ways by time-slicing (8 x 64 = 512 devices on dgx-a100)."""
    path.write_text(
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}\n" + extra
    )
    return path


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
