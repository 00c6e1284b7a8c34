"""Allocate answers (pure): which env vars, mounts, device nodes and CDI names a container gets.

Node facts (which control device nodes exist) come in as data in `ResponseOptions`; reading them is
`nvdp.plugin.host_facts`'s job."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from nvdp.api import pb
from nvdp.config.model import DEFAULT_CDI_ANNOTATION_PREFIX
from nvdp.config.runtime import CDI_KINDS
from nvdp.devices import Device

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
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
    extra_envs: tuple[tuple[str, str], ...] = ()  # GDS / MOFED / GDRCopy / IMEX switches
    cdi_kind: str = CDI_KINDS[0]  # NVIDIA's plugin's; or nvidia-ctk's (--cdi-kind)
    cdi_devices: tuple[str, ...] = ()  # CDI names every answer adds (gds/mofed/gdrcopy, IMEX)
    imex_channel_paths: tuple[str, ...] = ()  # passed as device specs with pass_device_specs
    mps_root: str | None = None  # --mps-root: MPS pipe / shm mounts (nvdp.mps.allocate)


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
    if "envvar" in strategies:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
    if "volume-mounts" in strategies:
        response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
        for device_id in ids:
            response.mounts.add(container_path=f"{VOLUME_MOUNTS_ROOT}/{device_id}", host_path="/dev/null")
    for key, value in options.extra_envs:
        response.envs[key] = value
    cdi_names = [f"{options.cdi_kind}={device_id}" for device_id in ids] + list(options.cdi_devices)
    if "cdi-annotations" in strategies:
        key = f"{options.cdi_annotation_prefix}{CDI_ANNOTATION_PLUGIN}_{request_id}"
        response.annotations[key] = ",".join(cdi_names)
    if "cdi-cri" in strategies:
        for name in cdi_names:
            response.cdi_devices.add(name=name)
    if options.pass_device_specs:
        paths: dict[str, None] = dict.fromkeys(options.control_devices + options.imex_channel_paths)
        for device in devices:
            paths.update(dict.fromkeys(device.paths))
        for path in paths:
            response.devices.add(
                container_path=path, host_path=host_path(options.dev_root, path), permissions="rw"
            )
    return response
