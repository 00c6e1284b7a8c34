"""CDI specs from the node's devices and the files found under its roots (pure).

One spec per class: `gpu` (a device per GPU and MIG device, plus `all`; the driver's control
nodes, libraries, binaries and hooks as edits common to all of them: `nvdp.node.cdi.edits`), `gds` /
`mofed` / `gdrcopy` (one device `all`) and `imex-channel` (a device per channel). Paths found under
the root as this process sees it are written as host paths: the host's driver root (dev root) in
front. `build_specs` is a function of its arguments alone (devices, what the node holds, settings),
so a caller with its own device set (a DRA claim) builds its spec the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nvdp.node.cdi.edits import Spec, common_edits, device_edits, device_node, host_mapper
from nvdp.node.cdi.names import (
    CDI_VERSION,
    CDI_VERSION_ADDITIONAL_GIDS,
    IMEX_CLASS,
    CdiSettings,
    imex_channel_name,
    imex_channel_path,
    qualified_name,
    spec_file_name,
    valid_device_name,
)
from nvdp.node.cdi.node_files import NodeFiles
from nvdp.node.gpus.devices import gpu_device, mig_device
from nvdp.node.nvml.types import GpuInfo

# Device nodes of the additional classes, as prefixes under /dev.
MODE_NODES = {
    "gds": ("/dev/nvidia-fs",),
    "mofed": ("/dev/infiniband/",),
    "gdrcopy": ("/dev/gdrdrv",),
}


@dataclass(frozen=True)
class CdiDevice:
    """One device of the `gpu` class: its CDI name and the device nodes it needs."""

    name: str
    paths: tuple[str, ...]


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
    not accept, is left out (`left_out`); so is a class with nothing to put in it (a problem).
    Devices are listed by name, as NVIDIA's spec lists them."""
    specs: dict[str, Spec] = {}
    names: set[str] = set()
    extra: list[str] = []
    problems: list[str] = []
    left_out: dict[str, str] = {}
    dev_host = host_mapper(settings.dev_root)

    def node(path: str) -> Spec:
        return device_node(path, dev_host(path), files.dev_nodes.get(path))

    def edits(paths: Sequence[str]) -> Spec:
        return device_edits(paths, files, settings, node)

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
            gpu_devices.append({"name": device.name, "containerEdits": edits(device.paths)})
            all_nodes.update(dict.fromkeys(device.paths))
    if gpu_devices:
        gpu_devices.append({"name": "all", "containerEdits": edits(list(all_nodes))})
        kind = settings.gpu_kind
        specs[spec_file_name(kind)] = _spec(kind, gpu_devices, common_edits(files, settings, node))
        names.update(qualified_name(kind, d["name"]) for d in gpu_devices)

    for mode in settings.modes:
        prefixes = MODE_NODES[mode]
        nodes = [p for p in files.dev_nodes if p.startswith(prefixes)]
        kind = f"{settings.vendor}/{mode}"
        if not nodes:
            problems.append(
                f"{kind}: no device nodes ({', '.join(prefixes)}*) under the dev root; not offered"
            )
            continue
        specs[spec_file_name(kind)] = _spec(kind, [{"name": "all", "containerEdits": edits(nodes)}])
        names.add(qualified_name(kind, "all"))
        extra.append(qualified_name(kind, "all"))

    channels: list[Spec] = []
    imex_kind = f"{settings.vendor}/{IMEX_CLASS}"
    for channel in settings.imex_channels:
        path = imex_channel_path(channel)
        if path not in files.dev_nodes:
            problems.append(f"{imex_kind}: {path} not found under the dev root; channel not offered")
            continue
        channels.append({"name": imex_channel_name(channel), "containerEdits": edits([path])})
        extra.append(qualified_name(imex_kind, imex_channel_name(channel)))
    if channels:
        specs[spec_file_name(imex_kind)] = _spec(imex_kind, channels)
        names.update(qualified_name(imex_kind, c["name"]) for c in channels)
    return BuiltSpecs(specs, frozenset(names), tuple(extra), tuple(problems), left_out)


def _spec(kind: str, devices: list[Spec], common: Spec | None = None) -> Spec:
    """A spec at the lowest CDI version that can express it (what the CDI library's
    MinimumRequiredVersion picks): 0.5.0 for `hostPath` and names such as `0`, 0.7.0 once a device
    node needs `additionalGids`."""
    every = [d["containerEdits"] for d in devices] + ([common] if common else [])
    version = CDI_VERSION_ADDITIONAL_GIDS if any("additionalGids" in e for e in every) else CDI_VERSION
    spec: Spec = {"cdiVersion": version, "kind": kind, "devices": sorted(devices, key=lambda d: d["name"])}
    if common:
        spec["containerEdits"] = common
    return spec


def render(spec: Spec) -> bytes:
    """The bytes written for a spec: stable, so unchanged content compares equal."""
    return (json.dumps(spec, indent=2) + "\n").encode()
