"""One benchmark run's plumbing: its options, work directories, the plugin and floor processes it
starts, and the table its sections fill."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness import start_floor
from bench.table import Table
from nvdp.sim.kubelet import Kubelet
from testkit import Process, free_port, start_plugin

GPU = "nvidia.com/gpu"
FLOOR = "example.com/floor"


@dataclass(frozen=True)
class Options:
    quick: bool  # only what the quick check measures (docs/benchmarks.md)
    idle_seconds: float
    calls: int  # Allocate calls per plugin, concurrency and device set
    rounds: int  # interleaved floor / nvdp rounds the calls are split into
    preferred_calls: int
    health_events: int
    restarts: int
    starts: int  # process starts per plugin, alternating with the floor's
    allocation_rows: bool
    commands: bool = True


@dataclass(frozen=True)
class DeviceSetSpec:
    label: str
    nvml: str
    config: Path | None = None
    metrics: bool = False


@contextlib.contextmanager
def registered(kubelet: Kubelet, process: Process, resource: str, what: str) -> Iterator[None]:
    """Wait for a started plugin process to register and list its devices; stop it afterwards and
    show its log when anything failed."""
    try:
        kubelet.wait_for_registration(resource, timeout=60)
        kubelet.wait_for_devices(resource, timeout=30)
        yield
    except BaseException:
        sys.stderr.write(f"{what} log ({process.log_path}):\n{process.log()[-4000:]}\n")
        raise
    finally:
        process.stop()


class Session:
    """What every section of a run shares."""

    def __init__(self, options: Options, workdir: Path) -> None:
        self.o = options
        self.workdir = workdir
        self.table = Table()
        self.rng = random.Random(0)
        self._dirs = 0

    def fresh_dir(self, name: str) -> Path:
        self._dirs += 1
        path = self.workdir / f"{self._dirs:02d}-{name}"
        path.mkdir()
        return path

    @contextlib.contextmanager
    def plugin(
        self,
        kubelet: Kubelet,
        spec: DeviceSetSpec,
        env: dict[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> Iterator[Process]:
        metrics = f"127.0.0.1:{free_port()}" if spec.metrics else ""
        process = start_plugin(
            kubelet.plugin_dir,
            spec.nvml,
            config_file=spec.config,
            metrics_address=metrics,
            env=env,
            extra=extra,
        )
        with registered(kubelet, process, GPU, "nvdp plugin"):
            yield process

    @contextlib.contextmanager
    def floor(self, kubelet: Kubelet, devices: int = 8) -> Iterator[Process]:
        process = start_floor(kubelet.plugin_dir / "floor.sock", kubelet.socket_path, FLOOR, devices=devices)
        with registered(kubelet, process, FLOOR, "floor plugin"):
            yield process

    def progress(self, message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)
