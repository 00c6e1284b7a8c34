"""Allocate answers (pure): which env vars, mounts, device nodes and CDI names a container gets.

As NVIDIA's plugin builds them: CDI names (annotations and/or CDI devices) and the GDS / MOFED /
GDRCopy switches always; the device list env var, the volume mounts, the IMEX channels' env var and
mounts, and the device specs of `--pass-device-specs` only with a strategy that is not CDI (with CDI
alone the CDI devices inject the nodes). Node facts (which control device nodes and IMEX channels
exist) come in as data in `ResponseOptions`; reading them is `nvdp.plugins.deviceplugin.host_facts`'s (and
`nvdp.plugins.deviceplugin.daemon_settings.imex_channels`') job."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from nvdp.api import pb
from nvdp.config.model import DEFAULT_CDI_ANNOTATION_PREFIX
from nvdp.config.runtime import CDI_KINDS
from nvdp.node.cdi.names import CDI_STRATEGIES, imex_channel_path
from nvdp.node.gpus.devices import Device

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
IMEX_CHANNELS_ENV = "NVIDIA_IMEX_CHANNELS"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"


@dataclass(frozen=True)
class ResponseOptions:
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"  # or "index"
    pass_device_specs: bool = False
    dev_root: str = "/"  # where /dev/nvidia* live on the host
    control_devices: tuple[str, ...] = ()  # those of devices.CONTROL_DEVICES present under dev_root
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    extra_envs: tuple[tuple[str, str], ...] = ()  # GDS / MOFED / GDRCopy switches
    cdi_kind: str = CDI_KINDS[0]  # NVIDIA's plugin's; or nvidia-ctk's (--cdi-kind)
    cdi_devices: tuple[str, ...] = ()  # CDI names every answer adds (gds/mofed/gdrcopy, IMEX)
    imex_channels: tuple[int, ...] = ()  # the configured IMEX channels present on the node
    mps_root: str | None = None  # --mps-root: MPS pipe / shm mounts (nvdp.node.mps.allocate)


def host_path(dev_root: str, path: str) -> str:
    """`path` (a /dev node) as seen on the host under `dev_root`."""
    return posixpath.join(dev_root, path.lstrip("/")) if dev_root not in ("", "/") else path


def visible_ids(devices: Sequence[Device], id_strategy: str) -> list[str]:
    """The IDs a container sees, one per underlying GPU / MIG device (replicas collapse), in order."""
    seen: dict[str, None] = {}
    for device in devices:
        seen[device.index if id_strategy == "index" else device.uuid] = None
    return list(seen)


def container_response(
    devices: Sequence[Device], options: ResponseOptions, request_id: str
) -> pb.ContainerAllocateResponse:
    """The answer for one container. `request_id` makes the CDI annotation key unique."""
    ids = visible_ids(devices, options.device_id_strategy)
    response = pb.ContainerAllocateResponse()
    strategies = options.device_list_strategy
    cdi_names = [f"{options.cdi_kind}={device_id}" for device_id in ids] + list(options.cdi_devices)
    if "cdi-annotations" in strategies:
        key = f"{options.cdi_annotation_prefix}{CDI_ANNOTATION_PLUGIN}_{request_id}"
        response.annotations[key] = ",".join(cdi_names)
    if "cdi-cri" in strategies:
        for name in cdi_names:
            response.cdi_devices.add(name=name)
    for key, value in options.extra_envs:
        response.envs[key] = value
    if all(s in CDI_STRATEGIES for s in strategies):
        return response
    channels = [str(c) for c in options.imex_channels]
    if "envvar" in strategies:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
        if channels:
            response.envs[IMEX_CHANNELS_ENV] = ",".join(channels)
    if "volume-mounts" in strategies:
        response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
        for name in (*ids, *(f"imex/{c}" for c in channels)):
            response.mounts.add(container_path=f"{VOLUME_MOUNTS_ROOT}/{name}", host_path="/dev/null")
    if options.pass_device_specs:
        paths: dict[str, None] = dict.fromkeys(options.control_devices)
        for device in devices:
            paths.update(dict.fromkeys(device.paths))
        paths.update(dict.fromkeys(imex_channel_path(c) for c in options.imex_channels))
        for path in paths:
            response.devices.add(
                container_path=path, host_path=host_path(options.dev_root, path), permissions="rw"
            )
    return response
