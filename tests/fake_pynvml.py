"""A hand-written stand-in for the `pynvml` module, for the real backend's tests.

It models a node as FakeGpu records and answers the pynvml functions nvdp.node.nvml.real calls, with
pynvml's calling conventions (handles, structures with the same field names, NVMLError(value)).
Set `FakeGpu.errors[function name] = NVML_ERROR_*` to make one call on one GPU fail.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NO_INSTANCE = 0xFFFFFFFF
NVML_GPU_FABRIC_STATE_COMPLETED = 3

_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _TEXT.get(self.value, f"NVML Error with code {self.value}")


class FabricInfoV1(ctypes.Structure):
    """pynvml's c_nvmlGpuFabricInfo_t (`state` a c_uint, as pynvml declares it)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class FabricInfoV2(ctypes.Structure):
    """pynvml's c_nvmlGpuFabricInfo_v2_t (c_nvmlGpuFabricInfoV_t), its version set at construction."""

    _fields_ = [("version", ctypes.c_uint), *FabricInfoV1._fields_, ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=0x02000024)


@dataclass
class FakeMig:
    uuid: str
    gi_id: int
    ci_id: int
    gpu_slices: int
    compute_slices: int
    memory_mb: int
    gi_profile_id: int = 19  # the driver's id of the 1g.5gb GPU instance profile on an A100
    start: int = 0  # the GPU instance's first memory slice
    memory_slices: int = 1
    multiprocessors: int = 14
    engines: tuple[int, int, int, int, int] = (1, 0, 0, 0, 0)  # copy, decoder, encoder, JPEG, OFA


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA A100-SXM4-40GB"
    minor: int = 0
    memory_bytes: int = 40960 * 1024 * 1024
    compute_capability: tuple[int, int] = (8, 0)
    numa_node: int | None = None  # None: nvmlDeviceGetNumaNodeId is NOT_SUPPORTED
    mig_mode: int | None = None  # None: not MIG capable (NOT_SUPPORTED)
    mig_slots: dict[int, FakeMig] = field(default_factory=dict)  # MIG device index -> device
    max_mig: int = 7
    gi_profiles: dict[int, int] = field(default_factory=dict)  # profile index -> profile id
    nvlinks: list[tuple[str, int]] = field(default_factory=list)  # active links: (remote bus id, type)
    supported_events: int = 0x0B  # single-bit, double-bit ECC, XID
    retired_pending: int | None = 0  # None: NOT_SUPPORTED
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # (corr, unc, pending, failure)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error value
    # (cluster UUID bytes, clique id, state, status); None: the fabric functions answer NOT_SUPPORTED
    fabric: tuple[bytes, int, int, int] | None = None


@dataclass(frozen=True)
class Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid


@dataclass
class FakeEventSet:
    registered: dict[str, int] = field(default_factory=dict)
    queue: deque[Any] = field(default_factory=deque)
    freed: int = 0


class FakePynvml:
    """The fake module. Module-level constants and NVMLError are reachable as attributes.
    `has_fabric_info_v1 = False`: the library lacks nvmlDeviceGetGpuFabricInfo (pynvml raises
    FUNCTION_NOT_FOUND for a symbol the library does not have)."""

    c_nvmlGpuFabricInfo_t = FabricInfoV1
    c_nvmlGpuFabricInfoV_t = FabricInfoV2
    has_fabric_info_v1 = True

    def __init__(self, gpus: list[FakeGpu], *, library_found: bool = True) -> None:
        self.gpus = gpus
        self.library_found = library_found
        self.nvmlLib: object = None
        self.libLoadLock = threading.Lock()
        self.initialized = False
        self.calls: list[str] = []
        self.topology: dict[frozenset[str], int] = {}  # pair of uuids -> topology level
        self.p2p_nvlink: dict[frozenset[str], int] = {}  # pair of uuids -> P2P status
        self.driver_version: bytes | str = "550.54.15"
        self.cuda_version = 12040
        self.event_sets: list[FakeEventSet] = []
        for name, value in globals().items():
            if name.startswith("NVML"):
                setattr(self, name, value)

    # helpers

    def _check(self, name: str, handle: Handle | None = None) -> None:
        self.calls.append(name)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None and name in handle.gpu.errors:
            raise NVMLError(handle.gpu.errors[name])

    def _gpu_by_bus(self, bus_id: str) -> FakeGpu | None:
        return next((g for g in self.gpus if g.bus_id == bus_id), None)

    def push_event(
        self, gpu: FakeGpu, event_type: int, data: int, gi: int = NO_INSTANCE, ci: int = NO_INSTANCE
    ) -> None:
        for event_set in self.event_sets:
            if event_set.registered.get(gpu.uuid, 0) & event_type:
                event_set.queue.append(
                    SimpleNamespace(
                        device=Handle(gpu),
                        eventType=event_type,
                        eventData=data,
                        gpuInstanceId=gi,
                        computeInstanceId=ci,
                    )
                )

    # library and system

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.nvmlLib is None:
            if not self.library_found:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
            self.nvmlLib = "default search path"
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> bytes | str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    # devices

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = Handle(self.gpus[index])
        self._check("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        self._check("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return Handle(gpu)
            for mig in gpu.mig_slots.values():
                if mig.uuid == uuid:
                    return Handle(gpu, mig)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._check("nvmlDeviceGetName", handle)
        return handle.gpu.name

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetMinorNumber", handle)
        return handle.gpu.minor

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        total = handle.mig.memory_mb * 1024 * 1024 if handle.mig else handle.gpu.memory_bytes
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability", handle)
        return handle.gpu.compute_capability

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=handle.gpu.bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetNumaNodeId", handle)
        if handle.gpu.numa_node is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.numa_node

    def _fabric(self, name: str, handle: Handle, ref: Any) -> int:
        self._check(name, handle)
        info = ref._obj  # what ctypes.byref(struct) points at
        if handle.gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        cluster, info.cliqueId, info.state, info.status = handle.gpu.fabric
        info.clusterUuid[:] = list(cluster)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Handle, ref: Any) -> int:
        if not self.has_fabric_info_v1:
            self.calls.append("nvmlDeviceGetGpuFabricInfo")
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._fabric("nvmlDeviceGetGpuFabricInfo", handle, ref)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Handle, ref: Any) -> int:
        if ref._obj.version != 0x02000024:
            raise NVMLError(25)  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", handle, ref)

    # MIG

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle)
        if handle.gpu.mig_mode is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [handle.gpu.mig_mode, handle.gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return handle.gpu.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        mig = handle.gpu.mig_slots.get(index)
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, mig)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        self._check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        return Handle(handle.gpu)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        assert handle.mig is not None
        return handle.mig.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetComputeInstanceId", handle)
        assert handle.mig is not None
        return handle.mig.ci_id

    def nvmlDeviceGetAttributes(self, handle: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetAttributes", handle)
        assert handle.mig is not None
        return SimpleNamespace(
            gpuInstanceSliceCount=handle.mig.gpu_slices,
            computeInstanceSliceCount=handle.mig.compute_slices,
            memorySizeMB=handle.mig.memory_mb,
            multiprocessorCount=handle.mig.multiprocessors,
            sharedCopyEngineCount=handle.mig.engines[0],
            sharedDecoderCount=handle.mig.engines[1],
            sharedEncoderCount=handle.mig.engines[2],
            sharedJpegCount=handle.mig.engines[3],
            sharedOfaCount=handle.mig.engines[4],
        )

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Handle, profile: int) -> SimpleNamespace:
        self._check("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if profile not in handle.gpu.gi_profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=handle.gpu.gi_profiles[profile])

    def nvmlDeviceGetGpuInstanceById(self, handle: Handle, gi_id: int) -> FakeMig:
        self._check("nvmlDeviceGetGpuInstanceById", handle)
        for mig in handle.gpu.mig_slots.values():
            if mig.gi_id == gi_id:
                return mig
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, instance: FakeMig) -> SimpleNamespace:
        self._check("nvmlGpuInstanceGetInfo")
        placement = SimpleNamespace(start=instance.start, size=instance.memory_slices)
        return SimpleNamespace(id=instance.gi_id, profileId=instance.gi_profile_id, placement=placement)

    # topology

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", a)
        return self.topology[frozenset((a.gpu.uuid, b.gpu.uuid))]

    def _link(self, handle: Handle, link: int) -> tuple[str, int] | None:
        if link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not handle.gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.nvlinks[link] if link < len(handle.gpu.nvlinks) else None

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", handle)
        return NVML_FEATURE_ENABLED if self._link(handle, link) else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        remote = self._link(handle, link)
        assert remote is not None
        return SimpleNamespace(busId=remote[0].encode())  # older pynvml hands back bytes

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        remote = self._link(handle, link)
        assert remote is not None
        return remote[1]

    def nvmlDeviceGetP2PStatus(self, a: Handle, b: Handle, index: int) -> int:
        self._check("nvmlDeviceGetP2PStatus", a)
        assert index == NVML_P2P_CAPS_INDEX_NVLINK
        return self.p2p_nvlink.get(frozenset((a.gpu.uuid, b.gpu.uuid)), NVML_P2P_STATUS_OK)

    # health

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if handle.gpu.retired_pending is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.retired_pending

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows", handle)
        if handle.gpu.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.remapped_rows

    # events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._check("nvmlDeviceGetSupportedEventTypes", handle)
        return handle.gpu.supported_events

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: FakeEventSet) -> None:
        self._check("nvmlDeviceRegisterEvents", handle)
        if event_types & ~handle.gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[handle.gpu.uuid] = event_set.registered.get(handle.gpu.uuid, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        if not event_set.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return event_set.queue.popleft()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check("nvmlEventSetFree")
        event_set.freed += 1
