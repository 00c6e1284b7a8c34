"""The real backend's MIG queries: a MIG-enabled GPU's MIG devices (for `gpus()`: with their GPU
instance's placement and their multiprocessors and engines) and the same devices as (GPU instance,
compute instance, profile) and UUID only (for `mig_layout()`, the device rescan's cheap query). Both
spell profile names through one helper, so the two answers always agree."""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any

from nvdp.base.errors import NvmlError
from nvdp.base.units import MIB
from nvdp.node.nvml.naming import PROFILE_SUFFIXES, mig_profile_name
from nvdp.node.nvml.types import MigDeviceInfo, MigEngines, MigPlacement, MigProfileInfo

if TYPE_CHECKING:
    from nvdp.node.nvml.real import RealNvml

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


_GI_PROFILE_PREFIX = "NVML_GPU_INSTANCE_PROFILE_"
_CI_PROFILE_PREFIX = "NVML_COMPUTE_INSTANCE_PROFILE_"
_UNOFFERED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT")  # not a profile of this GPU


class RealMigControl:
    """`nvdp.node.nvml.types.MigControl` through pynvml: profiles and placements (nvmlDeviceGetGpuInstance-
    ProfileInfo, nvmlDeviceGetGpuInstancePossiblePlacements_v2), a GPU instance made at a placement
    with one compute instance filling it, and both destroyed. MIG mode is never changed."""

    def __init__(self, nvml: RealNvml) -> None:
        self._nvml = nvml
        self._mig = RealMig(nvml)
        self._slice_counts: dict[tuple[str, int], int] = {}  # (GPU uuid, GI profile id) -> slices

    def _slices(self, gpu_uuid: str, placement: MigPlacement) -> int:
        """The compute slices of a GPU instance profile (its `sliceCount`)."""
        if (gpu_uuid, placement.profile_id) not in self._slice_counts:
            self.mig_profiles(gpu_uuid)
        return self._slice_counts.get((gpu_uuid, placement.profile_id), 0)

    def _constants(self, prefix: str) -> list[tuple[str, int]]:
        nv = self._nvml._nv
        found = [(n, getattr(nv, n)) for n in dir(nv) if n.startswith(prefix) and not n.endswith("_COUNT")]
        return sorted(((n, v) for n, v in found if isinstance(v, int)), key=lambda c: c[1])

    def mig_profiles(self, gpu_uuid: str) -> tuple[MigProfileInfo, ...]:
        nvml, nv = self._nvml, self._nvml._nv
        parent = nvml._handle(gpu_uuid)
        if not int(nvml._call("nvmlDeviceGetMigMode", parent, device=gpu_uuid)[0]):
            return ()
        suffixes = dict(PROFILE_SUFFIXES)
        total = self._mig._parent_memory(parent, gpu_uuid)
        found = []
        for constant, value in self._constants(_GI_PROFILE_PREFIX):
            try:
                info = nvml._call("nvmlDeviceGetGpuInstanceProfileInfo", parent, value, device=gpu_uuid)
            except NvmlError as e:
                if e.code in _UNOFFERED:
                    continue
                raise
            count = ctypes.c_uint(int(info.instanceCount))
            placements = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            nvml._call(
                "nvmlDeviceGetGpuInstancePossiblePlacements",
                parent,
                int(info.id),
                placements,
                ctypes.byref(count),
                device=gpu_uuid,
            )
            slices = int(info.sliceCount)
            name = mig_profile_name(slices, slices, int(info.memorySizeMB), total)
            name += suffixes.get(constant, "")
            engines = MigEngines(
                int(info.multiprocessorCount),
                int(info.copyEngineCount),
                int(info.decoderCount),
                int(info.encoderCount),
                int(info.jpegCount),
                int(info.ofaCount),
            )
            where = tuple(
                MigPlacement(int(info.id), int(p.start), int(p.size)) for p in placements[: count.value]
            )
            found.append(MigProfileInfo(name, int(info.id), int(info.memorySizeMB) * MIB, engines, where))
            self._slice_counts[(gpu_uuid, int(info.id))] = slices
        return tuple(found)

    def create_mig_device(self, gpu_uuid: str, placement: MigPlacement) -> MigDeviceInfo:
        nvml, nv = self._nvml, self._nvml._nv
        parent = nvml._handle(gpu_uuid)
        where = nv.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = placement.start, placement.size
        instance = nvml._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", parent, placement.profile_id, where, device=gpu_uuid
        )
        try:
            gi_id = int(nvml._call("nvmlGpuInstanceGetInfo", instance, device=gpu_uuid).id)
            ci_profile = getattr(nv, f"{_CI_PROFILE_PREFIX}{self._slices(gpu_uuid, placement)}_SLICE")
            info = nvml._call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo", instance, ci_profile, 0, device=gpu_uuid
            )
            nvml._call("nvmlGpuInstanceCreateComputeInstance", instance, int(info.id), device=gpu_uuid)
        except (NvmlError, AttributeError) as e:
            try:
                nvml._call("nvmlGpuInstanceDestroy", instance, device=gpu_uuid)
            except NvmlError as undone:
                logger.warning("GPU instance left after a failed create gpu=%s error=%r", gpu_uuid, undone)
            if isinstance(e, AttributeError):
                detail = f"no compute instance profile of {placement.size} slices"
                call = "nvmlGpuInstanceCreateComputeInstance"
                raise NvmlError("NVML_ERROR_NOT_SUPPORTED", call, detail, gpu_uuid) from e
            raise
        index = int(nvml._call("nvmlDeviceGetIndex", parent, device=gpu_uuid))
        return next(d for d in self._mig.devices(parent, gpu_uuid, index) if d.gi_id == gi_id)

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        nvml, nv = self._nvml, self._nvml._nv
        parent = nvml._handle(gpu_uuid)
        instance = nvml._call("nvmlDeviceGetGpuInstanceById", parent, gi_id, device=gpu_uuid)
        for _, value in self._constants(_CI_PROFILE_PREFIX):
            try:
                info = nvml._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", instance, value, 0, device=gpu_uuid
                )
            except NvmlError as e:
                if e.code in _UNOFFERED:
                    continue
                raise
            count = ctypes.c_uint(int(info.instanceCount))
            found = (nv.c_nvmlComputeInstance_t * max(count.value, 1))()
            nvml._call(
                "nvmlGpuInstanceGetComputeInstances",
                instance,
                int(info.id),
                found,
                ctypes.byref(count),
                device=gpu_uuid,
            )
            for ci in found[: count.value]:
                nvml._call("nvmlComputeInstanceDestroy", ci, device=gpu_uuid)
        nvml._call("nvmlGpuInstanceDestroy", instance, device=gpu_uuid)
