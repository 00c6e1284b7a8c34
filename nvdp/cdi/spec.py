"""CDI specs from the node's devices and the files found under its roots (pure).

One spec per class: `gpu` (a device per GPU and MIG device, plus `all`; the driver's control
nodes, libraries, binaries and hooks as edits common to all of them), `gds` / `mofed` / `gdrcopy`
(one device `all`) and `imex-channel` (a device per channel). Paths found under the root as this
process sees it are written as host paths: the host's driver root (dev root) in front.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nvdp.cdi.names import (
    CDI_VERSION,
    IMEX_CLASS,
    CdiSettings,
    imex_channel_name,
    imex_channel_path,
    qualified_name,
    spec_file_name,
    valid_device_name,
)
from nvdp.devices import CONTROL_DEVICES, gpu_device, mig_device
from nvdp.nvml.types import GpuInfo

MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
# Device nodes of the additional classes, as prefixes under /dev.
MODE_NODES = {
    "gds": ("/dev/nvidia-fs",),
    "mofed": ("/dev/infiniband/",),
    "gdrcopy": ("/dev/gdrdrv",),
}

Spec = dict[str, Any]


@dataclass(frozen=True)
class DriverFiles:
    """The driver's files found under a root, as paths inside it."""

    # (path in the container, the file it is inside the root): the same unless a symlink led there
    libraries: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (link path, target name): libcuda.so.1 -> libcuda.so.550...
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(os.path.dirname(p) for p, _ in self.libraries))


@dataclass(frozen=True)
class CdiDevice:
    """One device of the `gpu` class: its CDI name and the device nodes it needs."""

    name: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class NodeFiles:
    """What spec generation found on the node (see nvdp.cdi.scan)."""

    driver: DriverFiles = field(default_factory=DriverFiles)
    dev_nodes: frozenset[str] = frozenset()  # /dev/... paths present under the dev root


@dataclass(frozen=True)
class BuiltSpecs:
    specs: dict[str, Spec]  # file name -> spec
    names: frozenset[str]  # every qualified device name the specs define
    extra_names: tuple[str, ...]  # names every Allocate answer adds (gds/mofed/gdrcopy, IMEX)
    problems: tuple[str, ...]  # classes and channels left out, each with its reason
    left_out: Mapping[str, str] = field(default_factory=dict)  # gpu-class device name -> why not in it


def node_devices(
    gpus: Sequence[GpuInfo], mig_minors: Mapping[str, int] | None, id_strategy: str
) -> list[CdiDevice]:
    """A device per GPU and per MIG device, named as the device-ID strategy names it."""
    out: list[CdiDevice] = []
    for gpu in gpus:
        whole = gpu_device(gpu)
        out.append(CdiDevice(whole.index if id_strategy == "index" else whole.uuid, whole.paths))
        for mig in gpu.mig_devices:
            device = mig_device(gpu, mig, mig_minors)
            out.append(CdiDevice(device.index if id_strategy == "index" else device.uuid, device.paths))
    return out


def build_specs(devices: Sequence[CdiDevice], files: NodeFiles, settings: CdiSettings) -> BuiltSpecs:
    """Every spec the settings ask for. A device whose nodes are missing, or whose name CDI does
    not accept, is left out (`left_out`); so is a class with nothing to put in it (a problem)."""
    specs: dict[str, Spec] = {}
    names: set[str] = set()
    extra: list[str] = []
    problems: list[str] = []
    left_out: dict[str, str] = {}
    dev_host = _mapper(settings.dev_root)

    def node(path: str) -> dict[str, str]:
        return {"path": path, "hostPath": dev_host(path)}

    gpu_devices: list[Spec] = []
    all_nodes: dict[str, None] = {}
    for device in devices:
        missing = [p for p in device.paths if p not in files.dev_nodes]
        if not valid_device_name(device.name):
            left_out[device.name] = "not a valid CDI device name"
        elif missing:
            left_out[device.name] = f"{', '.join(missing)} not found under the dev root"
        elif any(d["name"] == device.name for d in gpu_devices):
            left_out[device.name] = "named twice"
        else:
            gpu_devices.append(
                {"name": device.name, "containerEdits": {"deviceNodes": [node(p) for p in device.paths]}}
            )
            all_nodes.update(dict.fromkeys(device.paths))
    if gpu_devices:
        gpu_devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(p) for p in all_nodes]}})
        kind = settings.gpu_kind
        specs[spec_file_name(kind)] = {
            "cdiVersion": CDI_VERSION,
            "kind": kind,
            "devices": gpu_devices,
            "containerEdits": _common_edits(files, settings, node),
        }
        names.update(qualified_name(kind, d["name"]) for d in gpu_devices)

    for mode in settings.modes:
        prefixes = MODE_NODES[mode]
        nodes = sorted(p for p in files.dev_nodes if p.startswith(prefixes))
        kind = f"{settings.vendor}/{mode}"
        if not nodes:
            problems.append(
                f"{kind}: no device nodes ({', '.join(prefixes)}*) under the dev root; not offered"
            )
            continue
        specs[spec_file_name(kind)] = {
            "cdiVersion": CDI_VERSION,
            "kind": kind,
            "devices": [{"name": "all", "containerEdits": {"deviceNodes": [node(p) for p in nodes]}}],
        }
        names.add(qualified_name(kind, "all"))
        extra.append(qualified_name(kind, "all"))

    channels: list[Spec] = []
    imex_kind = f"{settings.vendor}/{IMEX_CLASS}"
    for channel in settings.imex_channels:
        path = imex_channel_path(channel)
        if path not in files.dev_nodes:
            problems.append(f"{imex_kind}: {path} not found under the dev root; channel not offered")
            continue
        channels.append({"name": imex_channel_name(channel), "containerEdits": {"deviceNodes": [node(path)]}})
        extra.append(qualified_name(imex_kind, imex_channel_name(channel)))
    if channels:
        specs[spec_file_name(imex_kind)] = {"cdiVersion": CDI_VERSION, "kind": imex_kind, "devices": channels}
        names.update(qualified_name(imex_kind, c["name"]) for c in channels)
    return BuiltSpecs(specs, frozenset(names), tuple(extra), tuple(problems), left_out)


def render(spec: Spec) -> bytes:
    """The bytes written for a spec: stable, so unchanged content compares equal."""
    return (json.dumps(spec, indent=2) + "\n").encode()


def _common_edits(files: NodeFiles, settings: CdiSettings, node: Callable[[str], dict[str, str]]) -> Spec:
    driver = files.driver
    host = _mapper(settings.driver_root)
    edits: Spec = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    controls = [p for p in CONTROL_DEVICES if p in files.dev_nodes]
    if controls:
        edits["deviceNodes"] = [node(p) for p in controls]
    mounted = [*driver.libraries, *((p, p) for p in (*driver.binaries, *driver.firmware))]
    mounts = [
        {"hostPath": host(source), "containerPath": path, "options": list(MOUNT_OPTIONS)}
        for path, source in mounted
    ]
    if mounts:
        edits["mounts"] = mounts
    hooks: list[Spec] = []
    if driver.links and settings.hook_enabled("create-symlinks"):
        args: list[str] = []
        for link, target in driver.links:
            args += ["--link", f"{target}::{link}"]
        hooks.append(_hook(settings.hook_path, "create-symlinks", args))
    if driver.libraries and settings.hook_enabled("update-ldcache"):
        args = []
        for directory in driver.library_dirs:
            args += ["--folder", directory]
        hooks.append(_hook(settings.hook_path, "update-ldcache", args))
    if hooks:
        edits["hooks"] = hooks
    return edits


def _hook(path: str, name: str, args: list[str]) -> Spec:
    """A createContainer hook; `nvidia-ctk` takes its hooks as `nvidia-ctk hook <name>`."""
    program = os.path.basename(path)
    argv = [program, "hook", name] if program == "nvidia-ctk" else [program, name]
    return {"hookName": "createContainer", "path": path, "args": argv + args}


def _mapper(root: str) -> Callable[[str], str]:
    def host(path: str) -> str:
        return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))

    return host
