"""MIG devices made and destroyed on a simulated node (`SimNvml.mig_control()`), as real NVML answers:
profiles and placements as `nvidia-smi mig -lgip / -lgipp` lists, a GPU instance at a placement with
one compute instance filling it, and the driver's refusals:

- NVML_ERROR_NOT_SUPPORTED: MIG mode is off (nvdp never turns it on);
- NVML_ERROR_INVALID_ARGUMENT: a profile the GPU lacks, or a start that is none of its placements;
- NVML_ERROR_INSUFFICIENT_RESOURCES: a memory slice taken, compute slices all used, or a second
  instance of a once-per-GPU profile (`+me`);
- NVML_ERROR_NOT_FOUND: destroying a GPU instance that is not there.
- A new MIG device gets a new UUID, the driver's GI id, compute instance 0; indices follow (GI, CI).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from nvdp.base.errors import nvml_error
from nvdp.base.units import MIB
from nvdp.node.nvml.sim.mig import gpu_instance_profiles, parse_profile, sim_engines
from nvdp.node.nvml.sim.node import SimGpu, derived_uuid
from nvdp.node.nvml.types import MigDeviceInfo, MigPlacement, MigProfileInfo

if TYPE_CHECKING:
    from nvdp.node.nvml.sim.backend import SimNvml

logger = logging.getLogger(__name__)

_CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"
_DESTROY = "nvmlGpuInstanceDestroy"


def profiles_of(gpu: SimGpu) -> tuple[MigProfileInfo, ...]:
    """A simulated GPU's GPU instance profiles and their possible placements (() if not MIG capable)."""
    if not gpu.mig_capable:
        return ()
    geometry = gpu.mig_geometry
    return tuple(
        MigProfileInfo(
            name,
            profile_id,
            geometry.memory_mib(slices) * MIB,
            sim_engines(name, gpu.compute_capability[0]),
            tuple(MigPlacement(profile_id, start, slices) for start in starts),
        )
        for name, profile_id, slices, starts in gpu_instance_profiles(geometry)
    )


class SimMigControl:
    """`nvdp.node.nvml.types.MigControl` over a `SimNvml` (its lock and GPU state)."""

    def __init__(self, backend: SimNvml) -> None:
        self._sim = backend

    def mig_profiles(self, gpu_uuid: str) -> tuple[MigProfileInfo, ...]:
        call = "nvmlDeviceGetGpuInstancePossiblePlacements_v2"
        self._sim._require_init(call)
        gpu = self._sim.node.gpus[self._sim._gpu(gpu_uuid, call)]
        with self._sim._lock:
            enabled = self._sim._state[gpu.index].mig is not None
        return profiles_of(gpu) if enabled else ()

    def create_mig_device(self, gpu_uuid: str, placement: MigPlacement) -> MigDeviceInfo:
        sim = self._sim
        sim._require_init(_CREATE)
        gpu = sim.node.gpus[sim._gpu(gpu_uuid, _CREATE)]
        profile = next((p for p in profiles_of(gpu) if p.profile_id == placement.profile_id), None)
        with sim._lock:
            state = sim._state[gpu.index]
            if state.mig is None:
                raise nvml_error("NVML_ERROR_NOT_SUPPORTED", _CREATE, "MIG mode is disabled", gpu_uuid)
            if profile is None or placement.start not in (p.start for p in profile.placements):
                raise nvml_error(
                    "NVML_ERROR_INVALID_ARGUMENT",
                    _CREATE,
                    f"no placement {placement.start} of GPU instance profile {placement.profile_id}",
                    gpu_uuid,
                )
            size = profile.placements[0].size
            if why := _occupied(gpu, state.mig, profile.name, placement.start, size):
                raise nvml_error("NVML_ERROR_INSUFFICIENT_RESOURCES", _CREATE, why, gpu_uuid)
            gi_id = gpu.mig_geometry.gi_id(size, placement.start)
            state.created += 1
            device = MigDeviceInfo(
                uuid=derived_uuid("MIG", f"{gpu.uuid}/{gi_id}/0/{state.created}"),
                index=0,
                gi_id=gi_id,
                ci_id=0,
                profile=profile.name,
                memory_bytes=profile.memory_bytes,
                parent_uuid=gpu.uuid,
                parent_index=gpu.index,
                placement=MigPlacement(profile.profile_id, placement.start, size),
                engines=profile.engines,
            )
            state.mig = _indexed((*state.mig, device))
            device = next(d for d in state.mig if d.gi_id == gi_id)
        logger.info(
            "simulated MIG device created gpu=%s gi=%d ci=0 profile=%s placement=%d:%d uuid=%s",
            gpu.uuid,
            gi_id,
            profile.name,
            placement.start,
            size,
            device.uuid,
        )
        return device

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        sim = self._sim
        sim._require_init(_DESTROY)
        gpu = sim.node.gpus[sim._gpu(gpu_uuid, _DESTROY)]
        with sim._lock:
            state = sim._state[gpu.index]
            if state.mig is None or all(d.gi_id != gi_id for d in state.mig):
                call = "nvmlDeviceGetGpuInstanceById"
                raise nvml_error("NVML_ERROR_NOT_FOUND", call, f"no GPU instance {gi_id}", gpu_uuid)
            state.mig = _indexed(tuple(d for d in state.mig if d.gi_id != gi_id))
        logger.info("simulated MIG device destroyed gpu=%s gi=%d", gpu.uuid, gi_id)


def _occupied(gpu: SimGpu, devices: tuple[MigDeviceInfo, ...], name: str, start: int, size: int) -> str:
    """Why the GPU cannot take a GPU instance of profile `name` at [start, start+size), or ""."""
    instances = {d.gi_id: d for d in devices}.values()  # one per GPU instance
    wanted = set(range(start, start + size))
    for d in instances:
        where = d.placement
        if where is not None and wanted & set(range(where.start, where.start + where.size)):
            return f"memory slices {start}-{start + size - 1} overlap GPU instance {d.gi_id} ({d.profile})"
    used = sum(parse_profile(d.profile).gpu_slices for d in instances)
    if used + parse_profile(name).gpu_slices > gpu.mig_geometry.compute_slices:
        return f"{used} of {gpu.mig_geometry.compute_slices} compute slices in use"
    if "+" in name and any(d.profile == name for d in instances):
        return f"the GPU has one GPU instance of profile {name}"
    return ""


def _indexed(devices: tuple[MigDeviceInfo, ...]) -> tuple[MigDeviceInfo, ...]:
    ordered = sorted(devices, key=lambda d: (d.gi_id, d.ci_id))
    return tuple(replace(d, index=n) for n, d in enumerate(ordered))
