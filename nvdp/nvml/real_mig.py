"""The real backend's MIG queries: a MIG-enabled GPU's MIG devices (for `gpus()`: with their GPU
instance's placement and their multiprocessors and engines) and the same devices as (GPU instance,
compute instance, profile) and UUID only (for `mig_layout()`, the device rescan's cheap query). Both
spell profile names through one helper, so the two answers always agree."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nvdp.errors import NvmlError
from nvdp.nvml.naming import PROFILE_SUFFIXES, mig_profile_name
from nvdp.nvml.types import MigDeviceInfo, MigEngines, MigPlacement
from nvdp.units import MIB

if TYPE_CHECKING:
    from nvdp.nvml.real import RealNvml

logger = logging.getLogger(__name__)

Instance = tuple[int, int, str]  # (GPU instance id, compute instance id, profile name)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealMig:
    """MIG devices through pynvml. Caches, for one NVML session, each GPU's total memory (profile
    names are fractions of it) and its GPU instance profile ids that carry a name suffix."""

    def __init__(self, nvml: RealNvml) -> None:
        self._nvml = nvml
        self.memory: dict[str, int] = {}  # GPU uuid -> total memory bytes
        self._profile_suffixes: dict[str, dict[int, str]] = {}  # GPU uuid -> profile id -> suffix

    def devices(self, parent: Any, uuid: str, index: int) -> tuple[MigDeviceInfo, ...]:
        """Every MIG device of a MIG-enabled GPU, with its UUID and memory."""
        devices = []
        suffixes: dict[int, str] = {}
        placements: dict[int, MigPlacement | None] = {}
        for slot, handle in self._handles(parent, uuid):
            mig_uuid = _text(self._nvml._call("nvmlDeviceGetUUID", handle, device=f"{uuid} mig={slot}"))
            self._nvml._handles[mig_uuid] = handle
            (gi_id, ci_id, profile), attributes = self._instance(parent, uuid, handle, mig_uuid, suffixes)
            if gi_id not in placements:
                placements[gi_id] = self._placement(parent, uuid, gi_id)
            devices.append(
                MigDeviceInfo(
                    uuid=mig_uuid,
                    index=slot,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    profile=profile,
                    memory_bytes=int(attributes.memorySizeMB) * MIB,
                    parent_uuid=uuid,
                    parent_index=index,
                    placement=placements[gi_id],
                    engines=_engines(attributes),
                )
            )
        return tuple(devices)

    def instances(self, parent: Any, uuid: str) -> tuple[tuple[Instance, ...], tuple[str, ...]]:
        """The MIG devices of a MIG-enabled GPU as sorted (GPU instance, compute instance, profile)
        and their sorted UUIDs: per device its handle, UUID, instance ids and attributes (plus the GPU
        instance's profile id where the GPU has suffixed profiles)."""
        suffixes: dict[int, str] = {}
        found, uuids = [], []
        for slot, handle in self._handles(parent, uuid):
            where = f"{uuid} mig={slot}"
            uuids.append(_text(self._nvml._call("nvmlDeviceGetUUID", handle, device=where)))
            found.append(self._instance(parent, uuid, handle, where, suffixes)[0])
        return tuple(sorted(found)), tuple(sorted(uuids))

    def _handles(self, parent: Any, uuid: str) -> list[tuple[int, Any]]:
        """(slot, handle) of every MIG device; empty slots are skipped."""
        call = self._nvml._call
        handles = []
        for slot in range(int(call("nvmlDeviceGetMaxMigDeviceCount", parent, device=uuid))):
            try:
                handle = call(
                    "nvmlDeviceGetMigDeviceHandleByIndex", parent, slot, device=f"{uuid} mig={slot}"
                )
            except NvmlError as e:
                if e.code == "NVML_ERROR_NOT_FOUND":
                    continue
                raise
            handles.append((slot, handle))
        return handles

    def _instance(
        self, parent: Any, uuid: str, handle: Any, where: str, suffixes: dict[int, str]
    ) -> tuple[Instance, Any]:
        """One MIG device's (GPU instance, compute instance, profile name) and its NVML attributes
        (memory in MiB, slices, engines): the one place profile names come from. `suffixes` holds the
        suffix per GPU instance for one pass."""
        call = self._nvml._call
        gi_id = int(call("nvmlDeviceGetGpuInstanceId", handle, device=where))
        ci_id = int(call("nvmlDeviceGetComputeInstanceId", handle, device=where))
        attributes = call("nvmlDeviceGetAttributes", handle, device=where)
        memory_mib = int(attributes.memorySizeMB)
        profile = mig_profile_name(
            int(attributes.gpuInstanceSliceCount),
            int(attributes.computeInstanceSliceCount),
            memory_mib,
            self._parent_memory(parent, uuid),
        )
        if gi_id not in suffixes:
            suffixes[gi_id] = self._profile_suffix(parent, uuid, gi_id)
        return (gi_id, ci_id, profile + suffixes[gi_id]), attributes

    def _placement(self, parent: Any, uuid: str, gi_id: int) -> MigPlacement | None:
        """A GPU instance's profile id and memory slices; None when NVML does not say."""
        call = self._nvml._call
        try:
            instance = call("nvmlDeviceGetGpuInstanceById", parent, gi_id, device=uuid)
            info = call("nvmlGpuInstanceGetInfo", instance, device=uuid)
            return MigPlacement(int(info.profileId), int(info.placement.start), int(info.placement.size))
        except (NvmlError, AttributeError, TypeError, ValueError) as e:
            logger.debug("MIG placement unknown gpu=%s gi=%d error=%r", uuid, gi_id, str(e))
            return None

    def _parent_memory(self, parent: Any, uuid: str) -> int:
        if uuid not in self.memory:
            info = self._nvml._call("nvmlDeviceGetMemoryInfo", parent, device=uuid)
            self.memory[uuid] = int(info.total)
        return self.memory[uuid]

    def _profile_suffix(self, parent: Any, uuid: str, gi_id: int) -> str:
        """ "+me", "+me.all", "+gfx", "-me" for MIG devices of those GPU instance profiles, else ""."""
        call = self._nvml._call
        if uuid not in self._profile_suffixes:
            suffixes = {}
            for constant, suffix in PROFILE_SUFFIXES:
                profile = getattr(self._nvml._nv, constant, None)
                if profile is None:
                    continue
                try:
                    info = call("nvmlDeviceGetGpuInstanceProfileInfo", parent, profile, device=uuid)
                except NvmlError:  # not a profile of this GPU
                    continue
                suffixes[int(info.id)] = suffix
            self._profile_suffixes[uuid] = suffixes
        suffixes = self._profile_suffixes[uuid]
        if not suffixes:
            return ""
        try:
            instance = call("nvmlDeviceGetGpuInstanceById", parent, gi_id, device=uuid)
            profile_id = int(call("nvmlGpuInstanceGetInfo", instance, device=uuid).profileId)
        except NvmlError as e:
            logger.debug("MIG profile suffix unknown gpu=%s gi=%d error=%r", uuid, gi_id, str(e))
            return ""
        return suffixes.get(profile_id, "")


def _engines(attributes: Any) -> MigEngines | None:
    """A MIG device's multiprocessors and engines from nvmlDeviceGetAttributes; None when absent."""
    try:
        return MigEngines(
            int(attributes.multiprocessorCount),
            int(attributes.sharedCopyEngineCount),
            int(attributes.sharedDecoderCount),
            int(attributes.sharedEncoderCount),
            int(attributes.sharedJpegCount),
            int(attributes.sharedOfaCount),
        )
    except (AttributeError, TypeError, ValueError):
        return None
