"""`nvdp simulate --api dra`: the DRA kubelet plugin on a simulated (or real) node, against the kubelet
stand-in (plugin watcher, DRA manager) and an in-memory resource.k8s.io with NVIDIA's DeviceClasses.

Prints what a cluster would see: the published ResourceSlice, then claims allocated by the stand-in
scheduler (a whole GPU; a MIG device by its profile when the node has MIG devices), prepared through
NodePrepareResources, the CDI edits a container gets from the claim's spec, and unprepared. A
simulated node has no device files: they are made as empty files under the run's directory (the
driver root), so the specs show the nodes a real node's containers would get.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

from nvdp.base.bounded import loads_json
from nvdp.base.errors import NvdpError
from nvdp.base.files import read_bounded
from nvdp.config import PluginOptions
from nvdp.config.model import DRA_ALL, DRA_NONE
from nvdp.node.gpus.devices import CONTROL_DEVICES, gpu_device, mig_cap_paths, mig_device
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuInfo, GpuLayout, MigDeviceInfo
from nvdp.plugins.dra.driver import DraDriver
from nvdp.plugins.dra.names import DRIVER_NAME, claim_spec_file
from nvdp.plugins.dra.options import DraSettings
from nvdp.sim.dra.api import MemoryResourceApi
from nvdp.sim.dra.scheduler import allocate, consumed_capacity, nvidia_device_classes, taken_devices
from nvdp.sim.kubelet.dra import Claim, DraManager
from nvdp.sim.kubelet.plugin_watcher import PluginWatcher
from nvdp.sim.simulate_shares import show_shares

START_TIMEOUT_S = 20.0
NODE = "sim-node"


class DraSimulation:
    """`nvdp simulate`'s Simulation for DRA: the same use (`with`, `demo`, `serve_until`, `daemon`).
    Works in the run's directory (the kubelet socket's), and removes what it made there."""

    def __init__(
        self, options: PluginOptions, environ: Mapping[str, str], reload_config: Callable[[], PluginOptions]
    ) -> None:
        work = Path(options.config.flags.plugin.kubelet_socket).parent
        self._made = [work / name for name in ("plugins_registry", "plugins", "driver")]
        flags = options.config.flags
        if flags.mps_root is None:  # the run's own: never the host's /run/nvidia/mps, a real plugin's
            flags = replace(flags, mps_root=str(work / "mps"))
            self._made.append(work / "mps")
        simulated = options.runtime.nvml.startswith("sim:")
        if simulated and flags.nvidia_driver_root in (
            "",
            "/",
        ):  # a simulated node: its device files, made here
            flags = replace(flags, nvidia_driver_root=str(work / "driver"), nvidia_dev_root=None)
            flags = replace(flags, plugin=replace(flags.plugin, container_driver_root=str(work / "no-mount")))
            self.made_nodes = True
        else:
            self.made_nodes = False
        config = replace(options.config, flags=flags)
        if config.dra.devices == DRA_NONE:  # no device plugin beside it here: DRA serves every GPU,
            dra = replace(config.dra, devices=DRA_ALL)
            if dra.dynamic_mig == DRA_NONE:  # and makes MIG devices per claim on those in MIG mode
                dra = replace(dra, dynamic_mig=_mig_without_devices(options.runtime.nvml))  # without any
            config = replace(config, dra=dra)
        self.settings = DraSettings(
            config=config,
            runtime=options.runtime,
            node_name=NODE,
            cdi_root=options.runtime.cdi_spec_dir,
            kubelet_registrar_directory_path=str(work / "plugins_registry"),
            kubelet_plugins_directory_path=str(work / "plugins"),
        )
        self.api = MemoryResourceApi()
        for device_class in nvidia_device_classes().values():
            self.api.put("DeviceClass", device_class)
        self.api.put("Node", {"metadata": {"name": NODE, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, NODE))}})
        nvml = open_nvml(
            options.runtime.nvml,
            flags.nvidia_driver_root,
            flags.plugin.container_driver_root,
            environ=environ,
        )
        if self.made_nodes:
            _make_device_files(Path(flags.nvidia_driver_root), nvml)
        self.driver = DraDriver(self.settings, environ, nvml=nvml, api=self.api)
        self.watcher = PluginWatcher(Path(self.settings.kubelet_registrar_directory_path))
        self.kubelet = DraManager(self.watcher)
        self._thread = threading.Thread(target=self.driver.run, name="nvdp-dra", daemon=True)

    def __enter__(self) -> DraSimulation:
        self.watcher.start()
        self._thread.start()
        try:
            self.watcher.wait_for_registration(DRIVER_NAME, START_TIMEOUT_S)
            if not self.driver.publisher.published.wait(START_TIMEOUT_S):
                raise NvdpError(f"no ResourceSlice published within {START_TIMEOUT_S:.0f}s")
        except (TimeoutError, NvdpError) as error:
            self.__exit__(None, None, None)
            raise NvdpError(f"the DRA plugin did not start: {error}") from error
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.driver.request_stop()
        self._thread.join(5.0)
        self.kubelet.close()
        self.watcher.stop()
        for path in self._made:
            shutil.rmtree(path, ignore_errors=True)

    @property
    def daemon(self) -> DraDriver:
        """What `nvdp simulate` attaches the signals to (SIGHUP: the GPUs read again)."""
        return self.driver

    def demo(self, out: TextIO) -> None:
        nvml = self.driver.nvml
        plugin = self.watcher.plugins[DRIVER_NAME]
        out.write(
            f"nvdp simulate --api dra: node {self.settings.runtime.nvml}, driver {nvml.driver_version()}, "
            f"CUDA {nvml.cuda_driver_version()}\n"
            f"kubelet stand-in: {plugin.registration_socket} -> {plugin.endpoint}\n"
            f"  registered: {plugin.service}, health {plugin.health_service or 'none'}\n\n"
        )
        if self.made_nodes:
            root = self.settings.config.flags.nvidia_driver_root
            out.write(f"(device files of the simulated GPUs: empty files under {root})\n\n")
        slices = self.api.objects("ResourceSlice")
        for s in slices:
            spec = s["spec"]
            pool = spec["pool"]
            if "sharedCounters" in spec:
                sets = ", ".join(c["name"] for c in spec["sharedCounters"])
                out.write(f"ResourceSlice {s['metadata']['name']}: the counter sets {sets}\n")
                continue
            out.write(
                f"ResourceSlice {s['metadata']['name']}: driver {spec['driver']}, pool {pool['name']} "
                f"generation {pool['generation']}, {len(spec['devices'])} devices\n"
            )
            out.write(f"  {'NAME':<24} {'TYPE':<5} {'PRODUCT / PROFILE':<26} {'MEMORY':>9}  UUID\n")
            for d in spec["devices"]:
                a = d["attributes"]
                what = a["profile"]["string"] if "profile" in a else a["productName"]["string"]
                out.write(
                    f"  {d['name']:<24} {a['type']['string']:<5} {what:<26} "
                    f"{d['capacity']['memory']['value']:>9}  "
                    f"{a['uuid']['string'] if 'uuid' in a else '(a MIG placement, made when prepared)'}\n"
                )
        devices = [d for s in slices for d in s["spec"].get("devices") or []]
        if not devices:
            out.write("No devices published: the node has no GPUs.\n")
            return
        first = devices[0]
        out.write(f"\nAttributes of {first['name']}\n")
        for name, value in first["attributes"].items():
            out.write(f"  {name:<31} {next(iter(value.values()))}\n")
        capacity = ", ".join(f"{k}={v['value']}" for k, v in first["capacity"].items())
        out.write(f"  capacity: {capacity}\n")
        shared = next((d for d in devices if d.get("allowMultipleAllocations")), None)
        if shared is not None:
            show_shares(out, shared, self.allocated, self.kubelet, self.settings.cdi_root)
        elif any(d["attributes"]["type"]["string"] == "gpu" for d in devices):
            self._claim(out, "demo-gpu", "gpu.nvidia.com", "")
        mig = next((d for d in devices if d["attributes"]["type"]["string"] == "mig"), None)
        if mig is not None:
            profile = mig["attributes"]["profile"]["string"]
            self._claim(
                out,
                "demo-mig",
                "mig.nvidia.com",
                f"device.attributes['{DRIVER_NAME}'].profile == '{profile}'",
            )
        tries = "" if mig is not None else "--profile dgx-a100-mig, or "
        out.write(
            f"\nThat is what a cluster sees from this node with DRA. Try: {tries}--serve with "
            "NVDP_SIM_EVENTS to inject GPU faults (see README).\n"
        )

    def allocated(
        self, name: str, device_class: str, selector: str, capacity: Mapping[str, str] | None = None
    ) -> tuple[Claim, dict[str, Any]]:
        """A one-device claim (with a CEL selector and capacity requests, if given) allocated by the
        stand-in scheduler and stored. Raises AllocationError."""
        exactly: dict[str, Any] = {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": 1,
        }
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        if capacity:
            exactly["capacity"] = {"requests": dict(capacity)}
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"nvdp-simulate/{name}"))  # the same every run
        claim: dict[str, Any] = {
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        classes = {c["metadata"]["name"]: c for c in self.api.objects("DeviceClass")}
        others = self.api.objects("ResourceClaim")
        slices = self.api.objects("ResourceSlice")
        allocation = allocate(claim, classes, slices, taken_devices(others), NODE, consumed_capacity(others))
        claim["status"] = {"allocation": allocation}
        self.api.put("ResourceClaim", claim)
        return Claim("default", name, uid), claim

    def _claim(self, out: TextIO, name: str, device_class: str, selector: str) -> None:
        out.write(
            f"\nResourceClaim default/{name}: one device of class {device_class}"
            f"{f' where {selector}' if selector else ''}\n"
        )
        ref, _ = self.allocated(name, device_class, selector)
        before = self.driver.nvml.mig_layout()
        answer = self.kubelet.node_prepare(DRIVER_NAME, [ref]).claims[ref.uid]
        _write_mig_changes(out, before, self.driver.nvml.mig_layout())
        if answer.error:
            out.write(f"  NodePrepareResources -> error: {answer.error}\n")
            return
        for d in answer.devices:
            out.write(f"  allocated {d.device_name}; NodePrepareResources -> {', '.join(d.cdi_device_ids)}\n")
        path = Path(self.settings.cdi_root) / claim_spec_file(ref.uid)
        out.write(f"  container's CDI edits ({path.name})\n")
        _write_edits(out, path)
        before = self.driver.nvml.mig_layout()
        self.kubelet.node_unprepare(DRIVER_NAME, [ref])
        out.write(f"  NodeUnprepareResources -> spec {'left' if path.exists() else 'removed'}\n")
        _write_mig_changes(out, before, self.driver.nvml.mig_layout())

    def serve_until(self, stop: threading.Event, out: TextIO) -> None:
        self.kubelet.watch_health(DRIVER_NAME)
        deadline = time.monotonic() + START_TIMEOUT_S
        while (
            not self.kubelet.health.get(DRIVER_NAME) and time.monotonic() < deadline and not stop.wait(0.05)
        ):
            pass  # the stream's first message: the state changes are told from
        last = {device: h.health for device, h in dict(self.kubelet.health.get(DRIVER_NAME, {})).items()}
        out.write("\nServing; health changes are printed below (Ctrl-C to stop).\n")
        out.flush()
        while not stop.wait(0.2):
            for device, health in dict(self.kubelet.health.get(DRIVER_NAME, {})).items():
                if last.get(device, health.health) != health.health:
                    out.write(
                        f"  {device} -> {'Healthy' if health.health == 1 else 'Unhealthy'} {health.message}\n"
                    )
                    out.flush()
                last[device] = health.health


def _write_edits(out: TextIO, path: Path) -> None:
    spec = loads_json(read_bounded(path))  # the spec nvdp just wrote
    edits = [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
    for e in edits:
        for env in e.get("env") or []:
            out.write(f"    env        {env}\n")
    for e in edits:
        for node in e.get("deviceNodes") or []:
            out.write(f"    device     {node.get('hostPath', node['path'])} -> {node['path']}\n")
        for mount in e.get("mounts") or []:
            out.write(f"    mount      {mount['hostPath']} -> {mount['containerPath']}\n")
        for hook in e.get("hooks") or []:
            out.write(f"    hook       {hook['hookName']}: {' '.join(hook['args'])}\n")


def _write_mig_changes(out: TextIO, before: Mapping[str, GpuLayout], after: Mapping[str, GpuLayout]) -> None:
    """The MIG devices a call made or destroyed (dynamic MIG), as NVML lists them."""
    for uuid_, layout in after.items():
        old = before.get(uuid_)
        if old is not None and old.mig_uuids != layout.mig_uuids:
            made = sorted(set(layout.mig_uuids) - set(old.mig_uuids))
            gone = sorted(set(old.mig_uuids) - set(layout.mig_uuids))
            what = ", ".join([*(f"made {u}" for u in made), *(f"destroyed {u}" for u in gone)])
            out.write(f"  NVML, GPU {layout.index}: {what}; now {layout.describe()}\n")


def _mig_without_devices(nvml_spec: str) -> tuple[str, ...] | Literal["none"]:
    """The simulated GPUs in MIG mode without MIG devices (by index); none on another node."""
    if not nvml_spec.startswith("sim:"):
        return DRA_NONE
    nvml = open_nvml(nvml_spec)
    nvml.init()
    try:
        found = tuple(str(g.index) for g in nvml.gpus() if g.mig_enabled and not g.mig_devices)
    finally:
        nvml.shutdown()
    return found or DRA_NONE


def _make_device_files(root: Path, nvml: Any) -> None:
    """Empty files where a simulated node's device nodes would be."""
    nvml.init()
    try:
        paths: set[str] = set(CONTROL_DEVICES)
        for gpu in nvml.gpus():
            paths.update(gpu_device(gpu).paths)
            for mig in gpu.mig_devices:
                paths.update(mig_device(gpu, mig, None).paths)
            if gpu.mig_enabled:  # the MIG devices dynamic MIG may make: GPU instances 0-14
                paths.update(
                    p for gi in range(15) for p in mig_cap_paths(gpu.minor, _instance(gpu, gi), None)
                )
    finally:
        nvml.shutdown()
    for path in paths:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()


def _instance(gpu: GpuInfo, gi_id: int) -> MigDeviceInfo:
    return MigDeviceInfo("", 0, gi_id, 0, "", 0, gpu.uuid, gpu.index)
