"""The real NVML backend over pynvml, the only module that uses pynvml.

pynvml is imported when a `RealNvml` is constructed, never when this module is imported. Every
pynvml.NVMLError becomes an `NvmlError` (subclass) naming the NVML error, the call and the device.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import math
import os
from collections.abc import Callable
from typing import Any

from nvdp.errors import GpuLostError, NvmlError, NvmlLibraryNotFound, NvmlNotSupported
from nvdp.nvml import nvml_error
from nvdp.nvml.types import (
    ComputeMode,
    EventType,
    GpuInfo,
    GpuLink,
    MigDeviceInfo,
    NvmlEvent,
    PcieLevel,
    ProbeResult,
)

logger = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
# Where driver installs put the library, relative to a driver root (the GPU operator's /run/nvidia/driver).
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
MIB = 1024 * 1024
_NO_INSTANCE = 0xFFFFFFFF
# GPU instance profiles whose MIG devices carry a name suffix (go-nvlib's spelling).
_PROFILE_SUFFIXES = (
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", "+me"),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1", "+me"),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME", "+me.all"),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME", "+me.all"),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX", "+gfx"),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX", "+gfx"),
    ("NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX", "+gfx"),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME", "-me"),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME", "-me"),
)


def library_path(driver_root: str) -> str | None:
    """The libnvidia-ml.so.1 to load: None for the default search (driver root "/"), else the first
    one found under the root's library directories; NvmlLibraryNotFound naming the paths tried."""
    if os.path.normpath(driver_root) == "/":
        return None
    tried = [os.path.join(driver_root, d, LIBRARY) for d in LIBRARY_DIRS]
    for path in tried:
        if os.path.exists(path):
            return path
    raise NvmlLibraryNotFound(
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "load " + LIBRARY,
        f"driver root {driver_root}: tried {', '.join(tried)}",
    )


def mig_profile_name(gpu_slices: int, compute_slices: int, memory_mib: int, parent_memory_bytes: int) -> str:
    """A MIG device's profile name as NVIDIA's plugin spells it: "1g.5gb", or "1c.2g.10gb" for a
    compute instance smaller than its GPU instance. GB is the memory fraction rounded up to 1/8 of
    the parent's memory, times the parent's memory in GB (go-nvlib's rule)."""
    fraction = math.ceil(memory_mib * MIB / parent_memory_bytes * 8) / 8
    gb = math.floor(fraction * math.ceil(parent_memory_bytes / (1024 * MIB)) + 0.5)
    if compute_slices == gpu_slices:
        return f"{gpu_slices}g.{gb}gb"
    return f"{compute_slices}c.{gpu_slices}g.{gb}gb"


def normalize_bus_id(bus_id: str) -> str:
    """NVML's 8-hex-digit-domain, upper-case form: "0000:07:00.0" -> "00000000:07:00.0"."""
    domain, sep, rest = bus_id.strip().partition(":")
    if not sep:
        return bus_id.upper()
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return bus_id.upper()


def sysfs_bus_id(bus_id: str) -> str:
    """The sysfs name of a PCI device: "00000000:07:00.0" -> "0000:07:00.0" (lower case)."""
    domain, _, rest = normalize_bus_id(bus_id).partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _instance(value: int) -> int | None:
    return None if value == _NO_INSTANCE else int(value)


class RealNvml:
    """NVML through pynvml. `pynvml`, `sysfs_root` and `load_library` are injectable for tests."""

    def __init__(
        self,
        driver_root: str = "/",
        *,
        pynvml: Any = None,
        sysfs_root: str = "/sys",
        load_library: Callable[[str], object] = ctypes.CDLL,
    ) -> None:
        self._nv: Any = pynvml if pynvml is not None else importlib.import_module("pynvml")
        self._driver_root = driver_root
        self._sysfs_root = sysfs_root
        self._load_library = load_library
        self._library: object = None
        self._initialized = False
        self._error_names = {
            getattr(self._nv, name): name
            for name in dir(self._nv)
            if name.startswith("NVML_ERROR_") and isinstance(getattr(self._nv, name), int)
        }
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._handles: dict[str, Any] = {}
        self._bus_ids: dict[str, str] = {}
        self._nvlink_remotes: dict[str, list[tuple[str, bool]]] = {}
        self._profile_suffixes: dict[str, dict[int, str]] = {}
        self._last_gpus: dict[int, GpuInfo] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        if self._initialized:
            return
        path = self._preload()
        try:
            self._call("nvmlInit")
        except NvmlLibraryNotFound as e:
            raise NvmlLibraryNotFound(
                e.code, "nvmlInit", f"{LIBRARY} is not in the library search path (set --nvidia-driver-root?)"
            ) from e
        self._initialized = True
        logger.info("NVML initialized driver=%s library=%s", self.driver_version(), path or LIBRARY)

    def shutdown(self) -> None:
        if not self._initialized:
            return
        self._initialized = False
        self._reset_caches()
        try:
            self._call("nvmlShutdown")
        except NvmlError as e:
            logger.warning("NVML shutdown failed error=%r", str(e))

    def _preload(self) -> str | None:
        """Load the driver root's library so that pynvml uses it instead of the default search."""
        path = library_path(self._driver_root)
        if path is None:
            return None
        try:
            self._library = self._load_library(path)
        except OSError as e:
            raise NvmlLibraryNotFound(
                "NVML_ERROR_LIBRARY_NOT_FOUND", "load " + LIBRARY, f"{path}: {e}"
            ) from e
        # pynvml keeps its library handle in a module global under a lock; give it ours. (Loading by
        # path first also makes a later dlopen of the soname find this copy.)
        lock = getattr(self._nv, "libLoadLock", None)
        if lock is not None and hasattr(self._nv, "nvmlLib"):
            with lock:
                if self._nv.nvmlLib is None:
                    self._nv.nvmlLib = self._library
                elif self._nv.nvmlLib is not self._library:
                    logger.warning("NVML library was already loaded; keeping it wanted=%s", path)
        return path

    # -- queries -----------------------------------------------------------------------------

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        version = int(self._call("nvmlSystemGetCudaDriverVersion"))
        return f"{version // 1000}.{version % 1000 // 10}"

    def gpus(self) -> list[GpuInfo]:
        """Every GPU. A GPU lost since the last enumeration is listed with its last known facts."""
        gpus = []
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            try:
                gpus.append(self._gpu_info(index))
            except GpuLostError as e:
                known = self._last_gpus.get(index)
                if known is None:
                    raise
                logger.warning(
                    "GPU lost; listing its last known facts index=%d gpu=%s error=%r",
                    index,
                    known.uuid,
                    str(e),
                )
                gpus.append(known)
        self._last_gpus = {gpu.index: gpu for gpu in gpus}
        return gpus

    def _gpu_info(self, index: int) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"index={index}")
        uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=f"index={index}"))
        self._handles[uuid] = handle
        memory = int(self._call("nvmlDeviceGetMemoryInfo", handle, device=uuid).total)
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", handle, device=uuid)
        bus_id = self._bus_id(uuid, handle)
        mig_capable, mig_enabled = self._mig_mode(handle, uuid)
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=_text(self._call("nvmlDeviceGetName", handle, device=uuid)),
            minor=int(self._call("nvmlDeviceGetMinorNumber", handle, device=uuid)),
            memory_bytes=memory,
            compute_capability=(int(major), int(minor)),
            pci_bus_id=bus_id,
            numa_node=self._numa_node(handle, uuid, bus_id),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(handle, uuid, index, memory) if mig_enabled else (),
        )

    def _mig_mode(self, handle: Any, uuid: str) -> tuple[bool, bool]:
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", handle, device=uuid)
        except NvmlNotSupported:
            return False, False
        return True, current == self._nv.NVML_DEVICE_MIG_ENABLE

    def _mig_devices(self, parent: Any, uuid: str, index: int, memory: int) -> tuple[MigDeviceInfo, ...]:
        devices = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", parent, device=uuid))):
            where = f"{uuid} mig={slot}"
            try:
                handle = self._call("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot, device=where)
            except NvmlError as e:
                if e.code == "NVML_ERROR_NOT_FOUND":
                    continue
                raise
            mig_uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=where))
            self._handles[mig_uuid] = handle
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", handle, device=mig_uuid))
            attributes = self._call("nvmlDeviceGetAttributes", handle, device=mig_uuid)
            profile = mig_profile_name(
                int(attributes.gpuInstanceSliceCount),
                int(attributes.computeInstanceSliceCount),
                int(attributes.memorySizeMB),
                memory,
            )
            devices.append(
                MigDeviceInfo(
                    uuid=mig_uuid,
                    index=slot,
                    gi_id=gi_id,
                    ci_id=int(self._call("nvmlDeviceGetComputeInstanceId", handle, device=mig_uuid)),
                    profile=profile + self._profile_suffix(parent, uuid, gi_id),
                    memory_bytes=int(attributes.memorySizeMB) * MIB,
                    parent_uuid=uuid,
                    parent_index=index,
                )
            )
        return tuple(devices)

    def _profile_suffix(self, parent: Any, uuid: str, gi_id: int) -> str:
        """ "+me", "+me.all", "+gfx", "-me" for MIG devices of those GPU instance profiles, else ""."""
        if uuid not in self._profile_suffixes:
            suffixes = {}
            for constant, suffix in _PROFILE_SUFFIXES:
                profile = getattr(self._nv, constant, None)
                if profile is None:
                    continue
                try:
                    info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", parent, profile, device=uuid)
                except NvmlError:  # not a profile of this GPU
                    continue
                suffixes[int(info.id)] = suffix
            self._profile_suffixes[uuid] = suffixes
        suffixes = self._profile_suffixes[uuid]
        if not suffixes:
            return ""
        try:
            instance = self._call("nvmlDeviceGetGpuInstanceById", parent, gi_id, device=uuid)
            profile_id = int(self._call("nvmlGpuInstanceGetInfo", instance, device=uuid).profileId)
        except NvmlError as e:
            logger.debug("MIG profile suffix unknown gpu=%s gi=%d error=%r", uuid, gi_id, str(e))
            return ""
        return suffixes.get(profile_id, "")

    def _bus_id(self, uuid: str, handle: Any) -> str:
        if uuid not in self._bus_ids:
            info = self._call("nvmlDeviceGetPciInfo", handle, device=uuid)
            self._bus_ids[uuid] = normalize_bus_id(_text(info.busId))
        return self._bus_ids[uuid]

    def _numa_node(self, handle: Any, uuid: str, bus_id: str) -> int | None:
        """The CPU-side NUMA node: sysfs first (what the kubelet's topology manager aligns with, and
        what NVIDIA's plugin reads); NVML only where sysfs has no answer. On platforms where the GPU
        is its own NUMA node (Grace Hopper) nvmlDeviceGetNumaNodeId names the GPU memory's node,
        which has no CPUs, so it must not win over sysfs."""
        path = os.path.join(self._sysfs_root, "bus", "pci", "devices", sysfs_bus_id(bus_id), "numa_node")
        try:
            with open(path) as f:
                node = int(f.read().strip())
            if node >= 0:
                return node
        except (OSError, ValueError):
            pass
        if hasattr(self._nv, "nvmlDeviceGetNumaNodeId"):
            try:
                node = int(self._call("nvmlDeviceGetNumaNodeId", handle, device=uuid))
                return node if node >= 0 else None
            except GpuLostError:
                raise
            except NvmlError as e:
                logger.debug("no NUMA node from sysfs or NVML gpu=%s error=%r", uuid, str(e))
        return None

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        call = "nvmlDeviceGetTopologyCommonAncestor"
        if uuid_a == uuid_b:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT", call, "both devices are the same GPU", uuid_a)
        a, b = self._handle(uuid_a), self._handle(uuid_b)
        level = int(self._call(call, a, b, device=f"{uuid_a},{uuid_b}"))
        try:
            pcie = PcieLevel(level)
        except ValueError:  # a level newer than this code: assume the farthest
            pcie = PcieLevel.SYSTEM
        return GpuLink(self._nvlinks(uuid_a, a, uuid_b, b), pcie)

    def _nvlinks(self, uuid_a: str, a: Any, uuid_b: str, b: Any) -> int:
        """Direct NVLinks from a to b, plus (on NVSwitch systems) the links both have into the
        switch fabric when NVML reports NVLink P2P between them; NVIDIA's plugin ignores the latter."""
        remotes_a, remotes_b = self._remotes(uuid_a, a), self._remotes(uuid_b, b)
        bus_b = self._bus_id(uuid_b, b)
        links = sum(1 for bus, _ in remotes_a if bus == bus_b)
        switch_a = sum(1 for _, is_switch in remotes_a if is_switch)
        switch_b = sum(1 for _, is_switch in remotes_b if is_switch)
        if switch_a and switch_b and self._p2p_nvlink(a, b, uuid_a, uuid_b):
            links += min(switch_a, switch_b)
        return links

    def _remotes(self, uuid: str, handle: Any) -> list[tuple[str, bool]]:
        """(remote bus id, remote is an NVSwitch) of each active NVLink of a GPU."""
        if uuid in self._nvlink_remotes:
            return self._nvlink_remotes[uuid]
        remotes = []
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if (
                    self._call("nvmlDeviceGetNvLinkState", handle, link, device=uuid)
                    != self._nv.NVML_FEATURE_ENABLED
                ):
                    continue
                remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, device=uuid)
            except NvmlError as e:
                if e.code in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue  # no such link on this GPU
                raise
            remotes.append(
                (normalize_bus_id(_text(remote.busId)), self._remote_is_switch(handle, link, uuid))
            )
        self._nvlink_remotes[uuid] = remotes
        return remotes

    def _remote_is_switch(self, handle: Any, link: int, uuid: str) -> bool:
        try:
            kind = self._call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, device=uuid)
        except NvmlError:  # older driver: the remote's type is unknown
            return False
        return bool(kind == getattr(self._nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2))

    def _p2p_nvlink(self, a: Any, b: Any, uuid_a: str, uuid_b: str) -> bool:
        try:
            status = self._call(
                "nvmlDeviceGetP2PStatus",
                a,
                b,
                self._nv.NVML_P2P_CAPS_INDEX_NVLINK,
                device=f"{uuid_a},{uuid_b}",
            )
        except NvmlError:  # cannot tell: trust the switch links
            return True
        return bool(status == self._nv.NVML_P2P_STATUS_OK)

    def probe(self, gpu_uuid: str) -> ProbeResult:
        handle = self._handle(gpu_uuid)
        if gpu_uuid.startswith("MIG-"):
            handle = self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle, device=gpu_uuid)
        self._call("nvmlDeviceGetMemoryInfo", handle, device=gpu_uuid)
        retired = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", handle, device=gpu_uuid)
        rows = self._optional("nvmlDeviceGetRemappedRows", handle, device=gpu_uuid)
        return ProbeResult(
            retired_pages_pending=bool(retired),
            row_remap_failure=bool(rows and rows[3]),
            row_remap_pending=bool(rows and rows[2]),
        )

    def create_event_set(self) -> RealEventSet:
        return RealEventSet(self)

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        return ComputeMode(self._call("nvmlDeviceGetComputeMode", self._handle(gpu_uuid), device=gpu_uuid))

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self._call("nvmlDeviceSetComputeMode", self._handle(gpu_uuid), int(mode), device=gpu_uuid)

    # -- pynvml boundary ---------------------------------------------------------------------

    def _handle(self, uuid: str) -> Any:
        if uuid not in self._handles:
            self._handles[uuid] = self._call("nvmlDeviceGetHandleByUUID", uuid, device=uuid)
        return self._handles[uuid]

    def _uuid_of(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def _optional(self, name: str, *args: Any, device: str) -> Any:
        """A query some GPUs or drivers do not offer: None when not supported."""
        try:
            return self._call(name, *args, device=device)
        except NvmlError as e:
            if e.code in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return None
            raise

    def _call(self, name: str, *args: Any, device: str | None = None) -> Any:
        """Call pynvml.<name>; its NVMLError becomes our NvmlError naming the call and device."""
        function = getattr(self._nv, name, None)
        if function is None:
            raise NvmlError("NVML_ERROR_FUNCTION_NOT_FOUND", name, "not in this pynvml", device)
        try:
            return function(*args)
        except self._nv.NVMLError as e:
            value = getattr(e, "value", None)
            code = self._error_names.get(value, f"NVML_ERROR_CODE_{value}")
            try:
                detail = str(e)
            except Exception:  # pynvml asks the library for the text, which may be gone
                detail = ""
            raise nvml_error(code, name, detail, device) from e


class RealEventSet:
    """An NVML event set (nvmlEventSetCreate). Owned by one thread."""

    def __init__(self, nvml: RealNvml) -> None:
        self._nvml = nvml
        self._handle = nvml._call("nvmlEventSetCreate")
        self._closed = False

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        device = self._nvml._handle(gpu_uuid)
        supported = self._nvml._optional("nvmlDeviceGetSupportedEventTypes", device, device=gpu_uuid) or 0
        wanted = EventType(int(event_types) & int(supported))
        if not wanted:
            raise nvml_error(
                "NVML_ERROR_NOT_SUPPORTED",
                "nvmlDeviceRegisterEvents",
                f"event types {event_types!r}",
                gpu_uuid,
            )
        self._nvml._call("nvmlDeviceRegisterEvents", device, int(wanted), self._handle, device=gpu_uuid)
        return wanted

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        name = "nvmlEventSetWait_v2" if hasattr(self._nvml._nv, "nvmlEventSetWait_v2") else "nvmlEventSetWait"
        try:
            data = self._nvml._call(name, self._handle, max(timeout_ms, 0))
        except NvmlError as e:
            if e.code == "NVML_ERROR_TIMEOUT":
                return None
            raise
        return NvmlEvent(
            gpu_uuid=self._nvml._uuid_of(data.device),
            event_type=EventType(int(data.eventType)),
            data=int(data.eventData),
            gi_id=_instance(int(data.gpuInstanceId)),
            ci_id=_instance(int(data.computeInstanceId)),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml._call("nvmlEventSetFree", self._handle)
        except NvmlError as e:
            logger.warning("NVML event set free failed error=%r", str(e))
