"""The plugin as a real process, for the tests and the benchmarks.

`start_plugin(...)` runs `python -m nvdp.cli plugin` (simulated NVML by default) with a clean
environment (no inherited plugin flags or env vars). A `Process` writes its stderr to a file (a pipe
could fill up and block the process) and is stopped with SIGTERM, then SIGKILL. `wait_until` polls a
condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent  # the checkout: testkit/processes.py
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
    from nvdp.config import PLUGIN_OPTIONS

    option_envs = {env for option in PLUGIN_OPTIONS for env in option.envs}
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


def http_get(port: int, path: str) -> tuple[int, str]:
    """The status and body of `path` on 127.0.0.1:`port`; (0, "") while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return 0, ""


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
