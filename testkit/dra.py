"""The DRA kubelet plugin as a real process, for the tests and the benchmarks: one node's directories
(`DraNode`: the kubelet's plugins_registry and plugins directories, the CDI root, a driver root),
`start_dra_plugin`, which runs `python -m nvdp.cli dra-kubelet-plugin` on them, and a whole node to
drive (`dra_cluster`: the API stand-in serving NVIDIA's DeviceClasses, the kubelet stand-in's plugin
watcher and DRA manager, the plugin process); claims and the scheduler's allocation of them."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvdp.sim.dra.scheduler import allocate, consumed_capacity, nvidia_device_classes, taken_devices
from nvdp.sim.kubelet.dra import Claim, DraManager
from nvdp.sim.kubelet.plugin_watcher import PluginWatcher
from testkit.dirs import short_temp_dir
from testkit.driver_root import make_node
from testkit.kube_api_standin import KubeApiStandin
from testkit.nodes import sim_gpus
from testkit.processes import Process, clean_env

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DraNode:
    """A node's directories under `root`; the driver root (`driver_root`) is the caller's to fill."""

    root: Path
    name: str = "node-a"

    @property
    def registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def driver_root(self) -> Path:
        return self.root / "driver"

    @property
    def checkpoint(self) -> Path:
        return self.plugins / DRIVER / "checkpoint.json"

    def argv(
        self, nvml: str, kubeconfig: Path, extra: Sequence[str] = (), metrics_address: str = ""
    ) -> list[str]:
        """The command line; without `metrics_address`, no HTTP endpoint (the plugin's default port
        is the host's, not a test's)."""
        return [
            *(
                sys.executable,
                "-m",
                "nvdp.cli",
                "dra-kubelet-plugin",
                "--nvml",
                nvml,
                "--node-name",
                self.name,
            ),
            *("--kubeconfig", str(kubeconfig), "--cdi-root", str(self.cdi)),
            *("--kubelet-registrar-directory-path", str(self.registry)),
            *("--kubelet-plugins-directory-path", str(self.plugins)),
            *("--driver-root", str(self.driver_root), "--container-driver-root", str(self.root / "no-mount")),
            *("--metrics-address", metrics_address),
            *extra,
        ]


def start_dra_plugin(
    node: DraNode,
    nvml: str,
    kubeconfig: Path,
    *,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    log_path: Path | None = None,
    metrics_address: str = "",
) -> Process:
    """`nvdp dra-kubelet-plugin` for `node`, its stderr in `node.root/dra.log` (appended across runs).
    Its MPS root is `node.root/mps` unless `env` names one: never the host's /run/nvidia/mps."""
    argv = node.argv(nvml, kubeconfig, extra, metrics_address)
    return Process(
        argv,
        log_path or node.root / "dra.log",
        clean_env({"MPS_ROOT": str(node.root / "mps"), **(env or {})}),
    )


GROUP = "/apis/resource.k8s.io"
V1 = f"{GROUP}/v1"
NODE_UID = "5c8a9e1e-0000-4000-8000-00000000000a"
DEVICE_CLASSES = nvidia_device_classes()
DRA_ALL_CONFIG = "version: v1\ndra:\n  devices: all\n"
DYNAMIC_ALL = "version: v1\ndra:\n  devices: all\n  dynamicMig: all\n"  # MIG devices made per claim
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"  # a selector of one MIG profile


def serve_dra(api: KubeApiStandin, *versions: str) -> None:
    """Make the stand-in serve resource.k8s.io (v1 by default) with NVIDIA's DeviceClasses."""
    served = versions or ("v1",)
    api.put(
        GROUP,
        {
            "kind": "APIGroup",
            "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in served],
        },
    )
    for name, device_class in DEVICE_CLASSES.items():
        api.put(f"{V1}/deviceclasses/{name}", device_class)
    api.put("/api/v1/nodes/node-a", {"kind": "Node", "metadata": {"name": "node-a", "uid": NODE_UID}})


def claim_path(namespace: str, name: str, version: str = "v1") -> str:
    return f"{GROUP}/{version}/namespaces/{namespace}/resourceclaims/{name}"


def make_claim(
    api: KubeApiStandin,
    name: str,
    device_class: str = "gpu.nvidia.com",
    selector: str = "",
    namespace: str = "ns",
    capacity: Mapping[str, str] | None = None,
) -> Claim:
    """Create a one-device claim (a request named `gpu`, with an optional CEL selector and capacity
    requests: {"memory": "10Gi"})."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if capacity is not None:
        exactly["capacity"] = {"requests": dict(capacity)}
    uid = f"uid-{name}"
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    api.put(claim_path(namespace, name), obj)
    return Claim(namespace, name, uid)


def schedule(api: KubeApiStandin, claim: Claim, node: str = "node-a") -> list[str]:
    """Play the scheduler: allocate the claim from the published slices; the devices it got."""
    objects = dict(api.objects)
    classes = {o["metadata"]["name"]: o for p, o in objects.items() if p.startswith(f"{V1}/deviceclasses/")}
    slices = [o for p, o in sorted(objects.items()) if "/resourceslices/" in p]
    claims = [o for p, o in objects.items() if "/resourceclaims/" in p and o["metadata"]["uid"] != claim.uid]
    path = claim_path(claim.namespace, claim.name)
    allocation = allocate(
        objects[path], classes, slices, taken_devices(claims), node, consumed_capacity(claims)
    )
    api.merge_patch(path, {"status": {"allocation": allocation}})
    return [r["device"] for r in allocation["devices"]["results"]]


def slices_of(api: KubeApiStandin, node: str = "node-a") -> list[dict[str, Any]]:
    return [
        o for p, o in sorted(api.objects.items()) if "/resourceslices/" in p and o["spec"]["nodeName"] == node
    ]


def published(api: KubeApiStandin) -> dict[str, dict[str, Any]]:
    """The node's published devices by name."""
    return {d["name"]: d for s in slices_of(api) for d in s["spec"].get("devices") or []}


@dataclass
class DraCluster:
    """One node: the API stand-in, the kubelet stand-in (plugin watcher and DRA manager), the node's
    directories with a fake driver root, and the plugin process once `start()`ed."""

    api: KubeApiStandin
    node: DraNode
    nvml: str
    watcher: PluginWatcher
    kubelet: DraManager
    env: dict[str, str] = field(default_factory=dict)
    extra: Sequence[str] = ()
    process: Process | None = None
    metrics_address: str = ""  # none by default; "127.0.0.1:<free_port()>" to read the endpoint

    def start(self) -> Process:
        kubeconfig = self.api.write_kubeconfig(self.node.root / "kubeconfig")
        self.process = start_dra_plugin(
            self.node,
            self.nvml,
            kubeconfig,
            env=self.env,
            extra=self.extra,
            metrics_address=self.metrics_address,
        )
        return self.process

    def registered(self, after: int = 0) -> None:
        """Wait for the plugin's registration number `after` + 1 with the kubelet stand-in."""
        self.watcher.wait_for_registration(DRIVER, 30, after)

    def log(self) -> str:
        path = self.node.root / "dra.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def specs(self) -> dict[str, dict[str, Any]]:
        return {p.name: json.loads(p.read_text()) for p in sorted(self.node.cdi.glob("*.json"))}


@contextmanager
def dra_cluster(
    tmp_path: Path,
    nvml: str = "sim:pcie-4",
    *,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    config: str = DRA_ALL_CONFIG,
) -> Iterator[DraCluster]:
    """A DraCluster (not started) torn down after the block. The plugin reads `config` (CONFIG_FILE,
    unless `env` names another); by default it gives DRA every GPU. The node's directories live in a short
    directory of their own (`tmp_path` is kept for the test's own files)."""
    with short_temp_dir("nvdp-dra-") as short:
        node = DraNode(short / "node")
        make_node(node.driver_root, sim_gpus(nvml.removeprefix("sim:")))
        env = dict(env or {})
        if "CONFIG_FILE" not in env:
            (node.root / "config.yaml").write_text(config)
            env["CONFIG_FILE"] = str(node.root / "config.yaml")
        with KubeApiStandin() as api:
            serve_dra(api)
            watcher = PluginWatcher(node.registry)
            watcher.start()
            kubelet = DraManager(watcher)
            cluster = DraCluster(api, node, nvml, watcher, kubelet, env, extra)
            try:
                yield cluster
            finally:  # the cluster's kubelet parts: a test may have replaced them
                if cluster.process is not None:
                    cluster.process.stop()
                cluster.kubelet.close()
                cluster.watcher.stop()
