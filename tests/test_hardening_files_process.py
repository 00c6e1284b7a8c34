"""Issue 17 case 8, as processes: a config file (or ConfigMap entry, machine-type file, simulated node
file) that is `/dev/zero`, a FIFO, a 2 GB sparse file, a directory or a secret given by mistake is one
line and exit 1 at start, and one ERROR line at a reload that keeps the previous config while the
plugin keeps serving and still stops at SIGTERM. The child's memory is watched all along: it stays
small (the old code read `/dev/zero` until it held gigabytes, and blocked for ever on a FIFO)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, ProcStats, clean_env, plugin_argv, start_plugin, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.odd_files import ODD_KINDS, leaked, make_sparse, odd_path, write_shadow
from tests.test_config_manager import LABEL, NODE_PATH, ConfigMapDir, manager_argv

GPU = "nvidia.com/gpu"
MAX_RSS_MIB = 100  # the plugin serves a 4-GPU simulated node in about 40 MiB
DEADLINE = 30.0  # a loaded 2-core machine starts a Python process in a few seconds
NOT_A_CONFIG = (
    "not an nvdp/NVIDIA device plugin config: no known top-level key (found 4 keys, none of them a field name"
)


class MemoryWatch:
    """Samples a child's peak RSS; `ok()` fails the test (killing the child) once it passes the limit."""

    def __init__(self, process: Process, limit_mib: float = MAX_RSS_MIB) -> None:
        self.process, self.limit_mib, self.peak_mib = process, limit_mib, 0.0

    def ok(self) -> bool:
        try:
            self.peak_mib = max(self.peak_mib, ProcStats.read(self.process.pid).peak_rss_mib)
        except (OSError, KeyError, IndexError):  # gone, or a zombie without memory lines
            pass
        if self.peak_mib > self.limit_mib:
            self.process.kill()
            pytest.fail(
                f"the process grew to {self.peak_mib:.0f} MiB reading a file; log:\n{self.process.log()}"
            )
        return True

    def until(self, predicate: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
        wait_until(lambda: self.ok() and predicate(), timeout, what, interval=0.01)


def run_to_exit(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a command to its exit, its memory watched; (exit status, output)."""
    process = Process(argv, log, env or clean_env())
    try:
        MemoryWatch(process).until(lambda: not process.alive(), "exit")
        return process.wait(5), process.log()
    finally:
        process.kill()


def _failed_reloads(plugin: Process, count: int) -> bool:
    return plugin.log().count("reload failed") >= count


def repoint(link: Path, target: Path) -> None:
    """Point the symlink `link` at `target` in one rename, as config-manager does."""
    temporary = link.with_name(link.name + ".tmp")
    temporary.symlink_to(target)
    os.replace(temporary, link)


@pytest.mark.parametrize("kind", [*ODD_KINDS, "shadow"])
def test_plugin_start_with_an_odd_config_file_is_one_line_and_exit_1(
    sock_dir: Path, tmp_path: Path, kind: str
) -> None:
    if kind == "shadow":
        path, said = (
            write_shadow(tmp_path / "shadow"),
            f"{NOT_A_CONFIG}; known: version, flags, resources, sharing, imex, health, dra)",
        )
    else:
        path, reason = odd_path(kind, tmp_path)
        said = f"cannot read config file: {reason}"
    argv = plugin_argv(sock_dir / "kubelet.sock", "sim:pcie-4", config_file=path)
    status, output = run_to_exit(argv, tmp_path / "plugin.log")
    assert (status, output.splitlines()) == (1, [f"error: {path}: {said}"])
    assert leaked(output) == []


def test_plugin_start_with_a_simulated_node_file_that_is_dev_zero(sock_dir: Path, tmp_path: Path) -> None:
    argv = plugin_argv(sock_dir / "kubelet.sock", "sim:/dev/zero")
    status, output = run_to_exit(argv, tmp_path / "plugin.log")
    (line,) = output.splitlines()
    assert status == 1
    assert line.endswith(
        'ERROR   cannot start error="/dev/zero: cannot read simulated node file: is a character device"'
    )


def test_reload_onto_odd_files_keeps_serving_the_previous_config_and_stops_at_sigterm(
    sock_dir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    good = tmp_path / "ts2.yaml"
    good.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
    )
    config = tmp_path / "config.yaml"
    config.symlink_to(good)
    targets = [odd_path(kind, tmp_path) for kind in ODD_KINDS]
    targets.append((write_shadow(tmp_path / "shadow"), NOT_A_CONFIG))
    plugin = start_plugin(sock_dir, "sim:pcie-4", config_file=config)
    try:
        memory = MemoryWatch(plugin)
        memory.until(lambda: kubelet.devices(GPU), "registration")
        kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=DEADLINE)
        for n, (target, said) in enumerate(targets, start=1):
            repoint(config, target)
            plugin.send(signal.SIGHUP)
            memory.until(partial(_failed_reloads, plugin, n), f"reload failure {n}")
            (line,) = [line for line in plugin.log().splitlines() if "reload failed" in line][n - 1 : n]
            assert f"{config}: " in line and said in line, line
        assert plugin.alive() and len(kubelet.devices(GPU)) == 8
        replica = sorted(kubelet.devices(GPU))[0]
        assert "::" in replica and kubelet.allocate(GPU, [[replica]]).container_responses
        plugin.send(signal.SIGTERM)
        assert plugin.wait(10) == 0
    finally:
        plugin.stop()
    assert leaked(plugin.log()) == [] and "Traceback" not in plugin.log()
    assert memory.peak_mib < MAX_RSS_MIB


# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api


@pytest.mark.parametrize("entry", ["big", "passwd"])
def test_config_manager_oneshot_refuses_an_odd_entry_in_one_line(
    tmp_path: Path, api: KubeApiStandin, entry: str
) -> None:
    src = ConfigMapDir(tmp_path / "src", {"default": "version: v1\n", "big": "", "passwd": ""})
    make_sparse(src.root / "..data" / "big")
    write_shadow(src.root / "..data" / "passwd")
    api.patch_labels(NODE_PATH, {LABEL: entry})
    dst = tmp_path / "dst" / "config.yaml"
    argv = manager_argv(
        api.write_kubeconfig(tmp_path / "kubeconfig"), src.root, dst, tmp_path / "none", "--oneshot"
    )
    status, output = run_to_exit(argv, tmp_path / "manager.log", clean_env({"SEND_SIGNAL": "false"}))
    errors = [line for line in output.splitlines() if "ERROR" in line]
    reason = "larger than 1 MiB" if entry == "big" else NOT_A_CONFIG
    assert status == 1 and len(errors) == 1 and reason in errors[0], output
    assert not dst.exists()
    events = json.dumps(api.created)
    assert leaked(output + events) == [] and reason in events


def test_gfd_oneshot_with_a_machine_type_file_that_is_no_product_name(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    shadow = write_shadow(tmp_path / "shadow")
    argv = [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "sim:pcie-4", "--oneshot", "--no-timestamp"]
    argv += ["--machine-type-file", str(shadow), "--output-file", str(out)]
    env = {k: v for k, v in clean_env().items() if not k.startswith("GFD_") and k != "KUBECONFIG"}
    status, output = run_to_exit(argv, tmp_path / "gfd.log", env)
    assert status == 0, output
    assert "nvidia.com/gpu.machine=unknown\n" in out.read_text()
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        f'not a machine type; labelled unknown file={shadow} reason="more than one line"'
    )
    assert leaked(output + out.read_text()) == []
