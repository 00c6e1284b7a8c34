"""`gpu-kubelet-plugin` (the console script of `nvdp dra-kubelet-plugin`, the binary name of NVIDIA's
DRA driver) under the config-manager, as the chart runs it with a ConfigMap of entries: the node label
switches the entry, the config-manager re-links the file and signals the DRA plugin by name.

As in test_gfd_config_manager, the plugin runs from a copy of the console script in a per-test
directory and the manager is told its absolute path, so tests beside ours never get our signals.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from nvdp.side.configmanager import process
from testkit import REPO, Process, clean_env, wait_until
from tests.dra_support import dra_cluster, published
from tests.test_config_manager import LABEL, NODE_PATH, ConfigMapDir, console_script, manager_argv

# Two entries as docs/dra.md's example has them; both valid for either plugin.
ENTRIES = {"device-plugin": "version: v1\n", "dra": "version: v1\ndra:\n  devices: all\n"}


def test_console_script_is_declared() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gpu-kubelet-plugin"] == "nvdp.cli:dra_kubelet_plugin_main"


def test_the_node_label_reaches_the_dra_plugin_through_the_config_manager(
    tmp_path: Path, processes: list[Process]
) -> None:
    src = ConfigMapDir(tmp_path / "src", ENTRIES)
    dst = tmp_path / "dst" / "config.yaml"
    exe = console_script(tmp_path / "bin", "gpu-kubelet-plugin", "dra_kubelet_plugin_main")
    with dra_cluster(tmp_path) as cluster:
        kubeconfig = cluster.api.write_kubeconfig(tmp_path / "kubeconfig")

        def manager(*extra: str, log: str, **env: str) -> Process:
            argv = manager_argv(kubeconfig, src.root, dst, exe, "--default-config", "device-plugin", *extra)
            processes.append(Process(argv, tmp_path / log, clean_env(env)))
            return processes[-1]

        init = manager("--oneshot", log="init.log", SEND_SIGNAL="false")
        assert init.wait(30) == 0, init.log()
        assert dst.read_text() == ENTRIES["device-plugin"]

        # The chart's container: the console script, its config file the one the manager linked.
        argv = [str(exe), *cluster.node.argv(cluster.nvml, kubeconfig)[4:], "--config-file", str(dst)]
        plugin = cluster.process = Process(argv, tmp_path / "dra.log", clean_env())
        cluster.registered()  # its signal handlers are in place before it registers
        wait_until(lambda: "dra_devices=none" in plugin.log(), 10, "the device plugin's entry read")
        assert published(cluster.api) == {}  # every GPU is the device plugin's
        # PROCESS_TO_SIGNAL=gpu-kubelet-plugin (the chart's) finds the script by its name.
        assert plugin.pid in process.find("gpu-kubelet-plugin")

        sidecar = manager(log="sidecar.log")
        wait_until(lambda: "watching node label" in sidecar.log(), 30, "manager start")
        cluster.api.patch_labels(NODE_PATH, {LABEL: "dra"})
        wait_until(lambda: dst.read_text() == ENTRIES["dra"], 30, "the dra entry linked")
        wait_until(lambda: "SIGHUP received; reloading" in plugin.log(), 30, "the plugin signalled")
        assert plugin.log().count("SIGHUP received; reloading") == 1
        # the dra entry gives DRA every GPU: no device plugin serves them here, so they are published
        wait_until(lambda: len(published(cluster.api)) == 4, 10, "the GPUs published after the switch")
        assert plugin.alive() and "Traceback" not in plugin.log()
        sidecar.stop()
