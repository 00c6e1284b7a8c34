"""`mps-control-daemon` (the console script of `nvdp mps-control-daemon`) under the config-manager,
as the chart runs it with a ConfigMap of entries: the node label switches the entry, the
config-manager re-links the file and signals the daemon by name (SIGHUP), and the daemon re-limits
its MPS daemon to the new entry (against the stand-in `nvidia-cuda-mps-control`).

As in test_gfd_config_manager, the daemon runs from a copy of the console script in a per-test
directory and the manager is told its absolute path, so tests beside ours never get our signals.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from nvdp.node.mps.layout import MpsRoot
from nvdp.side.configmanager import process
from testkit import REPO, Process, clean_env, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.mps_standin import Standin
from tests.test_config_manager import LABEL, NODE_PATH, ConfigMapDir, console_script, manager_argv

# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api

GPU = "nvidia.com/gpu"
L40S_MIB = 46068  # pcie-4: 4 x L40S


def mps_config(replicas: int) -> str:
    return f"version: v1\nsharing:\n  mps:\n    resources: [{{name: nvidia.com/gpu, replicas: {replicas}}}]\n"


def test_console_script_is_declared() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mps-control-daemon"] == "nvdp.cli:mps_control_daemon_main"


def test_mps_daemon_follows_the_node_label_through_the_config_manager(
    tmp_path: Path, api: KubeApiStandin, processes: list[Process]
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    src = ConfigMapDir(tmp_path / "src", {"a": mps_config(2), "b": mps_config(4)})
    dst = tmp_path / "dst" / "config.yaml"
    root = MpsRoot(tmp_path / "mps")
    standin = Standin(tmp_path / "standin")
    exe = console_script(tmp_path / "bin", "mps-control-daemon", "mps_control_daemon_main")

    def manager(*extra: str, log: str, **env: str) -> Process:
        argv = manager_argv(kubeconfig, src.root, dst, exe, *extra)
        started = Process(argv, tmp_path / log, clean_env(env))
        processes.append(started)
        return started

    api.patch_labels(NODE_PATH, {LABEL: "a"})
    init = manager("--oneshot", log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()

    argv = [str(exe), "--nvml", "sim:pcie-4", "--config-file", str(dst), "--mps-root", str(root.path)]
    daemon = Process(
        [*argv, "--mps-health-interval", "1h"], tmp_path / "daemon.log", standin.env(clean_env())
    )
    processes.append(daemon)
    wait_until(lambda: root.marker(GPU).exists(), 30, "ready marker of entry a")
    assert f"set_default_device_pinned_mem_limit 0 {L40S_MIB // 2}M" in standin.commands()
    # PROCESS_TO_SIGNAL=mps-control-daemon (the chart's) finds the script by its name.
    assert daemon.pid in process.find("mps-control-daemon")

    sidecar = manager(log="sidecar.log")
    wait_until(lambda: "watching node label" in sidecar.log(), 30, "manager start")
    api.patch_labels(NODE_PATH, {LABEL: "b"})
    last = "set_default_active_thread_percentage 25"  # the last limit command sent
    wait_until(lambda: last in standin.commands(), 30, "limits of entry b after SIGHUP")
    assert f"set_default_device_pinned_mem_limit 0 {L40S_MIB // 4}M" in standin.commands()
    assert standin.commands().count("-d") == 1, "re-limited in place, not restarted"
    assert daemon.alive() and "Traceback" not in daemon.log()
