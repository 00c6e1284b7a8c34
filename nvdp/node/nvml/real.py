"""The real NVML backend over pynvml: enumeration, topology and probes (the only pynvml user).

- pynvml is imported when a `RealNvml` is constructed, never when this module is imported.
- Every pynvml.NVMLError becomes an `NvmlError` (subclass) naming the NVML error, call and device.
- Library lookup is in `nvdp.node.nvml.library`, the event set in `nvdp.node.nvml.real_events`, MIG devices
  and layouts in `nvdp.node.nvml.real_mig`.
- A GPU whose queries fail at its first enumeration is listed with the facts that could be read and
  `GpuInfo.fault` set (the health monitor holds it Unhealthy); other GPUs are listed as usual.
- A GPU that fails later keeps its last known facts.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nvdp.base.errors import GpuLostError, NvmlError, NvmlLibraryNotFound, NvmlNotSupported, nvml_error
from nvdp.node.nvml.library import LIBRARY, preload
from nvdp.node.nvml.naming import normalize_bus_id, pcie_root_of, sysfs_bus_id
from nvdp.node.nvml.real_events import RealEventSet
from nvdp.node.nvml.real_mig import RealMig, RealMigControl
from nvdp.node.nvml.real_topology import RealTopology
from nvdp.node.nvml.types import ComputeMode, GpuFabric, GpuInfo, GpuLayout, GpuLink, ProbeResult

logger = logging.getLogger(__name__)

# Failures of NVML itself, not of one GPU: enumeration stops with them.
_NODE_ERRORS = frozenset(
    {
        "NVML_ERROR_UNINITIALIZED",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML_ERROR_DRIVER_NOT_LOADED",
        "NVML_ERROR_FUNCTION_NOT_FOUND",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    }
)

# nvmlDeviceGetGpuFabricInfo (deprecated, still in every driver that has the V form) first, as go-nvlib
# asks for it; the versioned form where the library lacks it.
_FABRIC_CALLS = (
    ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealNvml:
    """NVML through pynvml. `pynvml`, `sysfs_root` and `load_library` are injectable for tests.

    The library is looked up under `container_driver_root`, then `driver_root`, then by the
    dynamic loader's default search (see `nvdp.node.nvml.library`)."""

    def __init__(
        self,
        driver_root: str = "/",
        *,
        container_driver_root: str | None = None,
        pynvml: Any = None,
        sysfs_root: str = "/sys",
        load_library: Callable[[str], object] = ctypes.CDLL,
    ) -> None:
        self._nv: Any = pynvml if pynvml is not None else importlib.import_module("pynvml")
        self._roots = (container_driver_root, driver_root)
        self._sysfs_root = sysfs_root
        self._load_library = load_library
        self._initialized = False
        self.waits_in_flight = 0  # nvmlEventSetWait calls under way (their threads write it)
        self._error_names = {
            getattr(self._nv, name): name
            for name in dir(self._nv)
            if name.startswith("NVML_ERROR_") and isinstance(getattr(self._nv, name), int)
        }
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._handles: dict[str, Any] = {}
        self._bus_ids: dict[str, str] = {}
        self._topology = RealTopology(self)
        self._mig = RealMig(self)
        self._last_gpus: dict[str, GpuInfo] = {}  # GPU uuid -> its last enumerated facts
        self._faults_logged: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        if self._initialized:
            return
        lookup = preload(self._nv, self._roots, self._load_library)
        try:
            self._call("nvmlInit")
        except NvmlLibraryNotFound as e:
            raise lookup.not_found() from e
        self._initialized = True
        logger.info("NVML initialized driver=%s library=%s", self.driver_version(), lookup.path or LIBRARY)

    def shutdown(self) -> None:
        if not self._initialized:
            return
        self._initialized = False
        self._reset_caches()
        if self.waits_in_flight:  # a stopped health thread still in its wait: the exit frees NVML
            logger.debug("NVML left to the process exit: an event wait is under way")
            return
        try:
            self._call("nvmlShutdown")
        except NvmlError as e:
            logger.warning("NVML shutdown failed error=%r", str(e))

    # -- queries -----------------------------------------------------------------------------

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        version = int(self._call("nvmlSystemGetCudaDriverVersion"))
        return f"{version // 1000}.{version % 1000 // 10}"

    def gpus(self) -> list[GpuInfo]:
        """Every GPU. One whose queries fail is listed with what could be read and `fault` set at
        its first enumeration, with its last known facts afterwards; NVML's own failures raise."""
        gpus = []
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            try:
                gpus.append(self._gpu_info(index))
                continue
            except NvmlError as e:
                if e.code in _NODE_ERRORS:
                    raise
                error = e
            known = self._known(index)
            if known is not None:
                logger.warning(
                    "GPU query failed; listing its last known facts index=%d gpu=%s error=%r",
                    index,
                    known.uuid,
                    str(error),
                )
                gpus.append(known)
                continue
            faulty = self._faulty_gpu(index, error)
            if faulty is not None:
                gpus.append(faulty)
        self._last_gpus = {gpu.uuid: gpu for gpu in gpus if gpu.fault is None}
        return gpus

    def _known(self, index: int) -> GpuInfo | None:
        """The last enumerated facts of the GPU at `index`, found by its UUID (indices shift when a
        GPU is unplugged or plugged back), at its index now; None when not known or no UUID."""
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"index={index}")
            known = self._last_gpus.get(
                _text(self._call("nvmlDeviceGetUUID", handle, device=f"index={index}"))
            )
        except NvmlError:
            return None
        if known is None or known.index == index:
            return known
        migs = tuple(replace(m, parent_index=index) for m in known.mig_devices)
        return replace(known, index=index, mig_devices=migs)

    def _faulty_gpu(self, index: int, error: NvmlError) -> GpuInfo | None:
        """What can still be read of a GPU whose enumeration failed; None without even a UUID."""
        where = f"index={index}"
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index, device=where)
            uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=where))
        except NvmlError as e:
            logger.error(
                "GPU not listed: its UUID cannot be read index=%d error=%r cause=%r",
                index,
                str(e),
                str(error),
            )
            return None
        self._handles[uuid] = handle

        def read(name: str, default: Any) -> Any:
            try:
                return self._call(name, handle, device=uuid)
            except NvmlError:
                return default

        pci = read("nvmlDeviceGetPciInfo", None)
        if uuid not in self._faults_logged:
            self._faults_logged.add(uuid)
            logger.warning(
                "GPU enumeration failed; advertising it Unhealthy gpu=%s index=%d error=%r",
                uuid,
                index,
                str(error),
            )
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=_text(read("nvmlDeviceGetName", "unknown")),
            minor=int(read("nvmlDeviceGetMinorNumber", index)),
            memory_bytes=0,
            compute_capability=(0, 0),
            pci_bus_id=normalize_bus_id(_text(pci.busId)) if pci is not None else "",
            numa_node=None,
            fault=str(error),
        )

    def mig_layout(self) -> dict[str, GpuLayout]:
        """The device rescan's cheap query: per GPU the handle, UUID and MIG mode; for a MIG-enabled
        GPU its MIG device handles with their UUIDs, instance ids and profiles (names as `gpus()` spells
        them: the same helper). A GPU whose queries fail answers as `gpus()` lists it: its last
        enumerated layout, else MIG disabled, else (no UUID) not at all."""
        layouts = {}
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            try:
                layout: GpuLayout | None = self._gpu_layout(index)
            except NvmlError as e:
                if e.code in _NODE_ERRORS:
                    raise
                layout = self._failing_layout(index)
            if layout is not None:
                layouts[layout.uuid] = layout
        return layouts

    def _gpu_layout(self, index: int) -> GpuLayout:
        handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"index={index}")
        uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=f"index={index}"))
        _capable, enabled = self._mig_mode(handle, uuid)
        instances, mig_uuids = self._mig.instances(handle, uuid) if enabled else ((), ())
        return GpuLayout(index, uuid, enabled, instances, mig_uuids)

    def _failing_layout(self, index: int) -> GpuLayout | None:
        known = self._known(index)
        if known is not None:
            return GpuLayout.of(known)
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"index={index}")
            uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=f"index={index}"))
        except NvmlError:
            return None
        return GpuLayout(index, uuid, False)

    def _gpu_info(self, index: int) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"index={index}")
        uuid = _text(self._call("nvmlDeviceGetUUID", handle, device=f"index={index}"))
        self._handles[uuid] = handle
        memory = int(self._call("nvmlDeviceGetMemoryInfo", handle, device=uuid).total)
        self._mig.memory[uuid] = memory
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
            mig_devices=self._mig.devices(handle, uuid, index) if mig_enabled else (),
            pcie_root=self._pcie_root(uuid, bus_id),
        )

    def _mig_mode(self, handle: Any, uuid: str) -> tuple[bool, bool]:
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", handle, device=uuid)
        except NvmlNotSupported:
            return False, False
        return True, current == self._nv.NVML_DEVICE_MIG_ENABLE

    def _bus_id(self, uuid: str, handle: Any) -> str:
        if uuid not in self._bus_ids:
            info = self._call("nvmlDeviceGetPciInfo", handle, device=uuid)
            self._bus_ids[uuid] = normalize_bus_id(_text(info.busId))
        return self._bus_ids[uuid]

    def _pcie_root(self, uuid: str, bus_id: str) -> str | None:
        """The PCIe root complex from sysfs (where /sys/bus/pci/devices/<id> points); None when it
        cannot be read (the DRA driver says so: it is the only user)."""
        path = os.path.join(self._sysfs_root, "bus", "pci", "devices", sysfs_bus_id(bus_id))
        try:
            root = pcie_root_of(os.readlink(path), bus_id)
        except OSError as e:
            logger.debug("no PCIe root from sysfs gpu=%s path=%s error=%r", uuid, path, str(e))
            return None
        if root is None:
            logger.debug("no PCIe root from sysfs gpu=%s path=%s (not a PCI hierarchy)", uuid, path)
        return root

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
        return self._topology.link(uuid_a, uuid_b)

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

    def gpu_fabric(self, gpu_uuid: str) -> GpuFabric | None:
        """go-nvlib's order: nvmlDeviceGetGpuFabricInfo where the library has it, else the versioned
        nvmlDeviceGetGpuFabricInfoV (its v2 struct); NOT_SUPPORTED from the one called means no fabric.
        pynvml takes the struct by reference and declares `state`, a C unsigned char, as a c_uint:
        its low byte is the state."""
        handle = self._handle(gpu_uuid)
        for function, struct in _FABRIC_CALLS:
            make = getattr(self._nv, struct, None)
            if make is None:  # a pynvml without this struct has no such function either
                continue
            info = make()
            try:
                self._call(function, handle, ctypes.byref(info), device=gpu_uuid)
            except NvmlError as e:
                if e.code == "NVML_ERROR_FUNCTION_NOT_FOUND":
                    continue
                if e.code == "NVML_ERROR_NOT_SUPPORTED":
                    return None
                raise
            return GpuFabric(
                cluster_uuid=bytes(info.clusterUuid),
                clique_id=int(info.cliqueId),
                state=int(info.state) & 0xFF,
                status=int(info.status),
            )
        return None

    def create_event_set(self) -> RealEventSet:
        return RealEventSet(self)

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        return ComputeMode(self._call("nvmlDeviceGetComputeMode", self._handle(gpu_uuid), device=gpu_uuid))

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self._call("nvmlDeviceSetComputeMode", self._handle(gpu_uuid), int(mode), device=gpu_uuid)

    # -- pynvml boundary ---------------------------------------------------------------------

    def mig_control(self) -> RealMigControl:  # making MIG devices: nvdp.node.nvml.real_mig
        return RealMigControl(self)

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
