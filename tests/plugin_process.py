"""Running `nvdp plugin` as a real subprocess for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from nvdp.nvml import open_nvml
from nvdp.nvml.types import GpuInfo

REPO = Path(__file__).resolve().parent.parent


def sim_gpus(profile: str) -> list[GpuInfo]:
    """The GPUs of a built-in simulated node, as the plugin under test will see them."""
    nvml = open_nvml(f"sim:{profile}")
    nvml.init()
    try:
        return nvml.gpus()
    finally:
        nvml.shutdown()


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; raise TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class PluginProcess:
    """`nvdp plugin ...` in a subprocess; stderr goes to a log file the test can read."""

    def __init__(
        self,
        sock_dir: Path,
        args: Sequence[str] = (),
        *,
        nvml: str = "sim:dgx-a100",
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.sock_dir = sock_dir
        self.kubelet_socket = sock_dir / "kubelet.sock"
        self.log_path = log_path or sock_dir / "plugin.log"
        self.argv = [
            sys.executable,
            "-m",
            "nvdp.cli",
            "plugin",
            "--nvml",
            nvml,
            "--kubelet-socket",
            str(self.kubelet_socket),
            "--metrics-address",
            "",
            *args,
        ]
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PluginProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=self._log, env=self.env, cwd=REPO)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> PluginProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
