"""The NVML facade: the small typed interface the rest of nvdp uses.

Two backends implement `Nvml`: `nvdp.node.nvml.real` (pynvml, the only importer of it) and
`nvdp.node.nvml.sim` (a simulated node). Both report failures as `nvdp.base.errors.NvmlError` subclasses
whose `code` is the NVML error name (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_GPU_IS_LOST, ...).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from nvdp.base.units import MIB


class PcieLevel(enum.IntEnum):
    """nvmlGpuTopologyLevel_t: the closest common PCIe ancestor of two GPUs (smaller is closer)."""

    INTERNAL = 0  # same board (multi-GPU card)
    SINGLE = 10  # one PCIe switch
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # the same host bridge
    NODE = 40  # the same NUMA node / CPU
    SYSTEM = 50  # across CPUs (SMP interconnect)


class EventType(enum.IntFlag):
    """nvmlEventType bits that the health code registers for."""

    SINGLE_BIT_ECC = 0x1
    DOUBLE_BIT_ECC = 0x2
    PSTATE = 0x4
    XID_CRITICAL = 0x8
    CLOCK = 0x10


@dataclass(frozen=True)
class MigPlacement:
    """Where a MIG device's GPU instance sits (nvmlGpuInstanceGetInfo): the GPU instance profile's
    id (the driver's, as `nvidia-smi mig -lgip` shows it) and the memory slices [start, start+size)."""

    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class MigEngines:
    """A MIG device's share of the GPU (nvmlDeviceGetAttributes): multiprocessors and engines."""

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True)
class MigDeviceInfo:
    """One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU.

    `placement` and `engines` are None where NVML would not say (an older driver, a failing query)."""

    uuid: str  # MIG-xxxxxxxx-...
    index: int  # MIG device index within the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    gi_id: int  # GPU instance id
    ci_id: int  # compute instance id
    profile: str  # e.g. "1g.5gb"
    memory_bytes: int
    parent_uuid: str
    parent_index: int
    placement: MigPlacement | None = None
    engines: MigEngines | None = None


@dataclass(frozen=True)
class MigProfileInfo:
    """A GPU instance profile whose GPU instance is one compute instance (nvmlDeviceGetGpuInstance-
    ProfileInfo), with every placement the GPU offers it (nvmlDeviceGetGpuInstancePossiblePlacements_v2)
    whether free or not: what a MIG device of it gets and where it may sit."""

    name: str  # "1g.5gb", "1g.5gb+me"
    profile_id: int
    memory_bytes: int
    engines: MigEngines
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML reports it.

    `fault` is set when the GPU's queries failed at enumeration (e.g. NVML_ERROR_GPU_IS_LOST): only
    the facts that could be read are real (uuid, index, minor; memory is 0), and the health monitor
    holds the GPU Unhealthy with `fault` as the reason, like a lost GPU.
    """

    index: int
    uuid: str  # GPU-xxxxxxxx-...
    name: str  # e.g. "NVIDIA A100-SXM4-40GB"
    minor: int  # /dev/nvidia<minor>
    memory_bytes: int
    compute_capability: tuple[int, int]
    pci_bus_id: str  # e.g. "00000000:07:00.0"
    numa_node: int | None  # None when neither NVML nor sysfs report one
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceInfo, ...] = field(default=())
    fault: str | None = None
    pcie_root: str | None = None  # the PCIe root complex, "pci0000:00"; None when sysfs does not say

    @property
    def memory_mib(self) -> int:
        return self.memory_bytes // MIB


@dataclass(frozen=True)
class GpuLayout:
    """One GPU's MIG layout (`Nvml.mig_layout`): what a MIG re-partition or a hot-plug changes, and
    nothing else (no memory, names, NUMA node or topology). `instances` and `mig_uuids` are sorted.
    The MIG devices' UUIDs are part of it: an identical layout destroyed and created again has new
    UUIDs (NVML gives each created MIG device a fresh one), and the served IDs must follow."""

    index: int
    uuid: str
    mig_enabled: bool
    instances: tuple[tuple[int, int, str], ...] = ()  # (GPU instance, compute instance, profile)
    mig_uuids: tuple[str, ...] = ()

    @classmethod
    def of(cls, gpu: GpuInfo) -> GpuLayout:
        """The layout part of an enumerated GPU."""
        instances = tuple(sorted((m.gi_id, m.ci_id, m.profile) for m in gpu.mig_devices))
        mig_uuids = tuple(sorted(m.uuid for m in gpu.mig_devices))
        return cls(gpu.index, gpu.uuid, gpu.mig_enabled, instances, mig_uuids)

    def describe(self) -> str:
        """`MIG disabled`, `MIG enabled, no MIG devices`, or profiles: `7x1g.5gb`, `1x3g.20gb+1x1g.5gb`."""
        if not self.mig_enabled:
            return "MIG disabled"
        if not self.instances:
            return "MIG enabled, no MIG devices"
        counts = Counter(profile for _, _, profile in self.instances)
        return "+".join(f"{n}x{profile}" for profile, n in counts.items())


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs are connected: NVLink count between them and their PCIe relationship."""

    nvlinks: int
    pcie: PcieLevel


@dataclass(frozen=True)
class NvmlEvent:
    """One event from an event set (nvmlEventData_t).

    `gi_id`/`ci_id` are None when NVML reports no instance (0xFFFFFFFF), i.e. the event concerns
    the whole GPU. `data` is the XID for XID_CRITICAL events.
    """

    gpu_uuid: str
    event_type: EventType
    data: int = 0
    gi_id: int | None = None
    ci_id: int | None = None


class FabricState(enum.IntEnum):
    """nvmlGpuFabricState_t: how far the GPU's registration with the NVLink fabric got."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


@dataclass(frozen=True)
class GpuFabric:
    """A GPU's place in a multi-node NVLink fabric (nvmlGpuFabricInfo_t / _v2_t, e.g. a GB200 NVL
    rack): the NVLink domain (`cluster_uuid`, 16 bytes) and the clique (a partition of that domain)
    it was registered into, how far registration got, and its outcome (`status`, an nvmlReturn_t:
    0 is success)."""

    cluster_uuid: bytes
    clique_id: int
    state: int  # a FabricState, as NVML answered it
    status: int = 0

    @property
    def attached(self) -> bool:
        """Registered with the fabric: state completed, a cluster UUID set and a status of success
        (go-nvlib's IsFabricAttached, which NVIDIA's gfd uses)."""
        return self.state == FabricState.COMPLETED and any(self.cluster_uuid) and self.status == 0


@dataclass(frozen=True)
class ProbeResult:
    """What one cheap health query of a GPU found (no exception means the GPU answered)."""

    retired_pages_pending: bool = False  # a page retirement waits for a reset
    row_remap_failure: bool = False  # row remapping failed: the GPU needs service
    row_remap_pending: bool = False  # remapping waits for a reset


class EventSet(Protocol):
    """An NVML event set. Not thread-safe: one thread owns it."""

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        """Register for the given types on a GPU; returns the subset the GPU supports.

        Raises NvmlNotSupported when the GPU supports none of them, GpuLostError when it is gone.
        """
        ...

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        """Block up to timeout_ms for one event; None on timeout. Other failures raise NvmlError."""
        ...

    def interrupt(self) -> None:
        """From any thread: a wait in progress (or the next one) returns None now. Real NVML cannot
        end a wait early: there it is a no-op and the wait ends at its timeout."""
        ...

    def close(self) -> None:
        """Free the set. Idempotent."""
        ...


class Nvml(Protocol):
    """A node's NVML: enumeration, topology, events and probes."""

    def init(self) -> None:
        """nvmlInit. Raises NvmlLibraryNotFound / NvmlError."""
        ...

    def shutdown(self) -> None:
        """nvmlShutdown. Idempotent."""
        ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. "12.4"."""
        ...

    def gpus(self) -> list[GpuInfo]:
        """Every GPU with its MIG devices, ordered by index."""
        ...

    def mig_layout(self) -> dict[str, GpuLayout]:
        """GPU uuid -> its MIG layout, in index order: the device rescan's cheap query (per GPU:
        handle, UUID, MIG mode, and for a MIG-enabled GPU its MIG devices' instance ids and
        profiles). Equal to `GpuLayout.of` over `gpus()` at the same moment, faulty GPUs included."""
        ...

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        """NVLink count and PCIe relationship between two GPUs."""
        ...

    def create_event_set(self) -> EventSet: ...

    def probe(self, gpu_uuid: str) -> ProbeResult:
        """One cheap query (memory info, pending retirements, row remapping); raises GpuLostError."""
        ...

    def gpu_fabric(self, gpu_uuid: str) -> GpuFabric | None:
        """The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfo, else ...InfoV); None
        when the GPU or the driver has no fabric (NVML_ERROR_NOT_SUPPORTED, or neither function in
        the library). Other failures raise NvmlError."""
        ...


class MigControl(Protocol):
    """Making MIG devices (both backends: `Nvml.mig_control()`); MIG mode itself is never changed."""

    def mig_profiles(self, gpu_uuid: str) -> tuple[MigProfileInfo, ...]:
        """The GPU's GPU instance profiles with their possible placements; () when MIG is off."""
        ...

    def create_mig_device(self, gpu_uuid: str, placement: MigPlacement) -> MigDeviceInfo:
        """A GPU instance of `placement.profile_id` at `placement.start` and one compute instance
        filling it (nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceCreateComputeInstance).
        Raises NvmlError: NVML_ERROR_INSUFFICIENT_RESOURCES for an occupied placement,
        NVML_ERROR_INVALID_ARGUMENT for one the profile does not have, NVML_ERROR_NOT_SUPPORTED
        when MIG mode is off."""
        ...

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy the GPU instance `gi_id` and its compute instances (NVML_ERROR_NOT_FOUND: none)."""
        ...


class ComputeMode(enum.IntEnum):
    """nvmlComputeMode_t. MPS needs EXCLUSIVE_PROCESS; DEFAULT is what it restores."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class ComputeModes(Protocol):
    """The compute-mode part of NVML (both backends provide it; the MPS control daemon uses it)."""

    def compute_mode(self, gpu_uuid: str) -> ComputeMode: ...

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        """nvmlDeviceSetComputeMode (needs root on a real node)."""
        ...
