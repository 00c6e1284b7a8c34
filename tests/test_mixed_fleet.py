"""One chart, one ConfigMap, a mixed fleet: every kind of simulated node goes through every entry of
one ConfigMap the way the chart runs it (the config-manager sidecar follows the node label, re-links
the plugin's config file and signals the plugin by name), and the plugin serves what fits the node,
warns about the rest and never exits; gpu-feature-discovery labels each node under each entry.

The MPS control daemon is not run here (tests/test_mps_daemon.py runs it): its ready marker is made
as the daemon makes it, so the MPS entry is served.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvdp.node.mps.layout import MpsRoot
from nvdp.sim.kubelet import Kubelet
from testkit import REPO, Process, clean_env, wait_until
from tests.kube_api_standin import KubeApiStandin
from tests.test_config_manager import LABEL, NODE, NODE_PATH, ConfigMapDir, console_script, manager_argv

DATA = REPO / "tests" / "data" / "gfd"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-"

ENTRIES = {
    "default": "version: v1\n",
    "time-slicing": (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 2}\n"
        "    - {name: nvidia.com/mig-1g.5gb, replicas: 4}\n"
    ),
    "mps": "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
    "mig-mixed": "version: v1\nflags:\n  migStrategy: mixed\n",
}


@dataclass(frozen=True)
class FleetNode:
    nvml: str
    # entry -> (resource -> devices, the misfit reasons the plugin warns about)
    expected: dict[str, tuple[dict[str, int], tuple[str, ...]]]


def whole(gpus: int) -> dict[str, tuple[dict[str, int], tuple[str, ...]]]:
    """A node without MIG: every entry serves nvidia.com/gpu; the MIG sharing entry does not apply."""
    return {
        "default": ({GPU: gpus}, ()),
        "time-slicing": ({GPU: 2 * gpus}, ("SharingEntryUnmatched",)),
        "mps": ({GPU: 4 * gpus}, ()),
        "mig-mixed": ({GPU: gpus}, ()),
    }


NODES = {
    "dgx-a100": FleetNode("sim:dgx-a100", whole(8)),
    "pcie-4": FleetNode("sim:pcie-4", whole(4)),
    "dgx-h100": FleetNode("sim:dgx-h100", whole(8)),
    # dgx-a100-mig in the middle of a re-partition: GPU 0 has MIG on and no MIG devices yet.
    "dgx-a100-mig-repartitioning": FleetNode(
        f"sim:{DATA / 'nodes' / 'dgx-a100-repartition.yaml'}",
        {
            "default": ({GPU: 8}, ()),  # strategy none: MIG-enabled GPUs are served whole
            "time-slicing": ({GPU: 16}, ("SharingEntryUnmatched",)),
            "mps": ({GPU: 32}, ()),
            "mig-mixed": (
                {GPU: 4, MIG + "2g.10gb": 4, MIG + "3g.20gb": 1, MIG + "1g.5gb": 1, MIG + "7g.40gb": 1},
                ("MigWithoutDevices",),
            ),
        },
    ),
}


def _warned_reasons(log: str) -> list[str]:
    return [
        line.rsplit(" reason=", 1)[1]
        for line in log.splitlines()
        if " WARNING " in line and " reason=" in line
    ]


@pytest.mark.parametrize("name", list(NODES))
def test_one_configmap_serves_every_node_of_a_mixed_fleet(
    name: str, tmp_path: Path, processes: list[Process]
) -> None:
    node = NODES[name]
    plugin_dir = tmp_path / "plugins"
    mps = MpsRoot(tmp_path / "mps")
    mps.marker(GPU).parent.mkdir(parents=True)
    mps.marker(GPU).touch()  # what `nvdp mps-control-daemon` leaves once its daemon is up
    src = ConfigMapDir(tmp_path / "src", ENTRIES)
    dst = tmp_path / "dst" / "config.yaml"
    plugin_exe = console_script(tmp_path / "bin", "nvidia-device-plugin", "plugin_main")
    with KubeApiStandin() as api, Kubelet(plugin_dir) as kubelet:
        api.put(NODE_PATH, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

        def manager(*extra: str, log: str) -> Process:
            argv = manager_argv(kubeconfig, src.root, dst, plugin_exe, "--default-config", "default", *extra)
            started = Process(argv, tmp_path / log, clean_env())
            processes.append(started)
            return started

        api.patch_labels(NODE_PATH, {LABEL: "default"})
        init = manager("--oneshot", log="init.log")
        assert init.wait(30) == 0, init.log()
        argv = [str(plugin_exe), "--nvml", node.nvml, "--kubelet-socket", str(plugin_dir / "kubelet.sock")]
        argv += ["--metrics-address", "", "--config-file", str(dst), "--mps-root", str(mps.path)]
        plugin = Process(argv, tmp_path / "plugin.log", clean_env())
        processes.append(plugin)
        sidecar = manager(log="sidecar.log")
        wait_until(lambda: "watching node label" in sidecar.log(), 30, "config-manager watching")

        for entry, (served, reasons) in node.expected.items():
            seen = len(plugin.log())
            if entry != "default":
                api.patch_labels(NODE_PATH, {LABEL: entry})
            for resource, count in served.items():
                kubelet.wait_for_devices(resource, lambda d, n=count: len(d) == n, timeout=30)
            assert sorted(kubelet.resources()) == sorted(served), entry
            wait_until(
                lambda r=reasons, s=seen: set(r) <= set(_warned_reasons(plugin.log()[s:])), 10, "warnings"
            )
            assert set(_warned_reasons(plugin.log()[seen:])) == set(reasons), entry
            labels = _gfd(node.nvml, dst, tmp_path / f"{entry}.labels")
            assert labels["nvidia.com/gpu.count"] != "", entry
            assert plugin.alive(), entry

        plugin.send(signal.SIGTERM)
        assert plugin.wait(10) == 0
    assert "Traceback" not in plugin.log() + sidecar.log()


def _gfd(nvml: str, config: Path, out: Path) -> dict[str, str]:
    """`nvdp gfd --oneshot` on the config the plugin runs with: it labels the node, whatever fits."""
    argv = [
        sys.executable,
        "-m",
        "nvdp.cli",
        "gfd",
        "--oneshot",
        "--nvml",
        nvml,
        "--config-file",
        str(config),
    ]
    argv += ["--output-file", str(out), "--machine-type-file", str(DATA / "product_name")]
    done = subprocess.run(argv, env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return dict(line.split("=", 1) for line in out.read_text().splitlines())
