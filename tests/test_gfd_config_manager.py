"""`gpu-feature-discovery` (the console script of `nvdp gfd`, NVIDIA's binary name) under the
config-manager, as the chart runs it with a ConfigMap of entries: the node label switches the entry,
the config-manager re-links the file and signals GFD by name, and GFD's labels follow.

As in test_config_manager, GFD runs from a copy of the console script in a per-test directory and
the manager is told its absolute path, so tests beside ours never get our signals.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from nvdp.side.configmanager import process
from testkit import REPO, Process, clean_env, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.test_config_manager import LABEL, NODE_PATH, ConfigMapDir, console_script, manager_argv, ts
from tests.test_gfd_process import DATA

# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api


def test_console_script_is_declared() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gpu-feature-discovery"] == "nvdp.cli:gfd_main"


def test_gfd_labels_follow_the_node_label_through_the_config_manager(
    tmp_path: Path, api: KubeApiStandin, processes: list[Process]
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    src = ConfigMapDir(tmp_path / "src", {"a": ts(2), "b": ts(4)})
    dst = tmp_path / "dst" / "config.yaml"
    out = tmp_path / "features.d" / "gfd"
    out.parent.mkdir()
    gfd_exe = console_script(tmp_path / "bin", "gpu-feature-discovery", "gfd_main")

    def manager(*extra: str, log: str, **env: str) -> Process:
        argv = manager_argv(kubeconfig, src.root, dst, gfd_exe, *extra)
        started = Process(argv, tmp_path / log, clean_env(env))
        processes.append(started)
        return started

    api.patch_labels(NODE_PATH, {LABEL: "a"})
    init = manager("--oneshot", log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()

    argv = [str(gfd_exe), "--nvml", "sim:pcie-4", "--machine-type-file", str(DATA / "product_name")]
    argv += ["--output-file", str(out), "--config-file", str(dst), "--sleep-interval", "1h"]
    gfd = Process(argv, tmp_path / "gfd.log", clean_env())
    processes.append(gfd)
    wait_until(lambda: out.exists() and "nvidia.com/gpu.replicas=2\n" in out.read_text(), 30, "labels of a")
    # PROCESS_TO_SIGNAL=gpu-feature-discovery (the chart's) finds the script by its name.
    assert gfd.pid in process.find("gpu-feature-discovery")

    sidecar = manager(log="sidecar.log")
    wait_until(lambda: "watching node label" in sidecar.log(), 30, "manager start")
    api.patch_labels(NODE_PATH, {LABEL: "b"})
    wait_until(lambda: "nvidia.com/gpu.replicas=4\n" in out.read_text(), 30, "labels of b after SIGHUP")
    assert gfd.log().count("SIGHUP received; reloading") == 1
    assert gfd.alive() and "Traceback" not in gfd.log()
