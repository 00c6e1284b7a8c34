"""This node's DRA devices with NVIDIA's DRA driver's attributes and capacities (pure), so its
DeviceClasses and users' selectors match: a GPU without MIG is type `gpu`, a MIG-enabled GPU is its
MIG devices, type `mig` (the GPU itself is not offered).

- gpu: `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`,
  `driverVersion`, `cudaDriverVersion` (semver), `resource.kubernetes.io/pciBusID` (`0000:07:00.0`),
  `resource.kubernetes.io/pcieRoot` (`pci0000:00`, left out when unknown); capacity `memory`.
- mig: `type`, `uuid`, `parentUUID`, `profile` and the parent's product to PCIe root; capacities
  `memory`, `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`,
  `memorySlice<N>` (1 per memory slice of its GPU instance).
- Kept for older claims: `index`, `minor` (gpu), `index`, `parentIndex` (mig), `pcieBusID` (both).
- `brand` is read from the product name (Tesla, Quadro, ..., else Nvidia); `architecture` from
  the compute capability (Volta, ..., Blackwell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nvdp.node.gpus.devices import gpu_device, mig_device
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.nvml.naming import sysfs_bus_id
from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo, MigPlacement
from nvdp.plugins.dra.names import (
    GPU_TYPE,
    MIG_TYPE,
    former_mig_device_name,
    gpu_device_name,
    mig_device_name,
)

Attributes = dict[str, dict[str, Any]]  # name -> {"string" | "int" | "bool" | "version": value}
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

_BRANDS = (  # product name prefix -> NVML brand, as go-nvlib names it; the first match counts
    ("Tesla", "Tesla"),
    ("Quadro RTX", "QuadroRTX"),
    ("Quadro", "Quadro"),
    ("NVIDIA GeForce RTX", "GeForceRTX"),
    ("GeForce RTX", "GeForceRTX"),
    ("NVIDIA GeForce", "GeForce"),
    ("GeForce", "GeForce"),
    ("NVIDIA TITAN RTX", "TitanRTX"),
    ("TITAN RTX", "TitanRTX"),
    ("NVIDIA TITAN", "Titan"),
    ("TITAN", "Titan"),
    ("NVIDIA RTX", "NvidiaRTX"),
)
_ARCHITECTURES = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}
_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


@dataclass(frozen=True)
class DraDevice:
    """One device of this driver's pool: its name in the slice, the GPU or MIG uuid behind it, the
    device nodes a container needs, and what the slice says of it."""

    name: str
    uuid: str
    gpu_uuid: str  # the physical GPU (the uuid itself for a whole GPU)
    paths: tuple[str, ...]
    attributes: Attributes = field(default_factory=dict)
    capacity: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {"value": quantity}
    former_name: str | None = None  # a MIG device's name before NVIDIA's v25.12 form
    allow_multiple_allocations: bool = False  # shared by capacity (nvdp.plugins.dra.capacity)
    # A MIG placement made when a claim is prepared (`nvdp.plugins.dra.mig_partitions`): where, the counter
    # set it consumes from (published in the pool's `sharedCounters`) and what it consumes of it.
    placement: MigPlacement | None = None
    counter_set: Mapping[str, Any] | None = None
    consumes: Mapping[str, Any] | None = None

    @property
    def type(self) -> str:
        return str(self.attributes["type"]["string"])

    def slice_entry(self) -> dict[str, Any]:
        """The device as a ResourceSlice (resource.k8s.io/v1) lists it."""
        entry: dict[str, Any] = {"name": self.name, "attributes": self.attributes, "capacity": self.capacity}
        if self.allow_multiple_allocations:
            entry["allowMultipleAllocations"] = True
        return {**entry, "consumesCounters": [dict(self.consumes)]} if self.consumes else entry


@dataclass(frozen=True)
class DriverFacts:
    """The node-wide facts every device carries."""

    driver_version: str  # "550.54.15"
    cuda_driver_version: str  # "12.4"


def node_devices(
    gpus: Sequence[GpuInfo], facts: DriverFacts, mig_minors: Mapping[str, int] | None = None
) -> list[DraDevice]:
    """The devices of `gpus` (those this driver publishes), in GPU index order, MIG devices by index."""
    out: list[DraDevice] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        common = _common(gpu, facts)
        if not gpu.mig_enabled:
            attributes: Attributes = {
                "type": {"string": GPU_TYPE},
                "uuid": {"string": gpu.uuid},
                **common,
                "index": {"int": gpu.index},
                "minor": {"int": gpu.minor},
                "pcieBusID": common[PCI_BUS_ID],
            }
            capacity = {"memory": quantity(gpu.memory_bytes)}
            paths = gpu_device(gpu).paths
            out.append(DraDevice(gpu_device_name(gpu), gpu.uuid, gpu.uuid, paths, attributes, capacity))
            continue
        for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
            out.append(_mig(gpu, mig, common, mig_minors))
    return out


def _mig(
    gpu: GpuInfo, mig: MigDeviceInfo, common: Attributes, mig_minors: Mapping[str, int] | None
) -> DraDevice:
    attributes: Attributes = {
        "type": {"string": MIG_TYPE},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
        **common,
        "index": {"int": mig.index},
        "parentIndex": {"int": gpu.index},
        "pcieBusID": common[PCI_BUS_ID],
    }
    capacity = {"memory": quantity(mig.memory_bytes)}
    if mig.engines is not None:
        engines = mig.engines
        capacity.update(
            multiprocessors=quantity(engines.multiprocessors),
            copyEngines=quantity(engines.copy_engines),
            decoders=quantity(engines.decoders),
            encoders=quantity(engines.encoders),
            jpegEngines=quantity(engines.jpeg_engines),
            ofaEngines=quantity(engines.ofa_engines),
        )
    if mig.placement is not None:
        for n in range(mig.placement.start, mig.placement.start + mig.placement.size):
            capacity[f"memorySlice{n}"] = quantity(1)
    paths = mig_device(gpu, mig, mig_minors).paths
    name, former = mig_device_name(gpu, mig), former_mig_device_name(gpu, mig)
    return DraDevice(name, mig.uuid, gpu.uuid, paths, attributes, capacity, former)


def _common(gpu: GpuInfo, facts: DriverFacts) -> Attributes:
    major, minor = gpu.compute_capability
    return {
        "productName": {"string": gpu.name},
        "brand": {"string": brand(gpu.name)},
        "architecture": {"string": architecture(major, minor)},
        "cudaComputeCapability": {"version": semver(f"{major}.{minor}")},
        "driverVersion": {"version": semver(facts.driver_version)},
        "cudaDriverVersion": {"version": semver(facts.cuda_driver_version)},
        PCI_BUS_ID: {"string": pcie_bus_id(gpu.pci_bus_id)},
        **({PCIE_ROOT: {"string": gpu.pcie_root}} if gpu.pcie_root else {}),
    }


def device_misfits(gpus: Sequence[GpuInfo]) -> tuple[Misfit, ...]:
    """What keeps the GPUs DRA serves from being published in full, each kind one misfit naming all
    its GPUs: MIG enabled without MIG devices (no device at all), a PCIe root not known (no
    `resource.kubernetes.io/pcieRoot`). A GPU lost at enumeration is left to the health monitor."""
    ordered = sorted((g for g in gpus if g.fault is None), key=lambda g: g.index)
    empty = [g for g in ordered if g.mig_enabled and not g.mig_devices]
    rootless = [g for g in ordered if not g.pcie_root]
    misfits = []
    if empty:
        misfits.append(
            Misfit(
                "MigWithoutDevices",
                _gpus(empty),
                f"{_gpus(empty)} ({', '.join(g.uuid for g in empty)}) have MIG enabled but no MIG "
                "devices; they offer no DRA device until MIG devices are created",
            )
        )
    if rootless:
        paths = ", ".join(f"/sys/bus/pci/devices/{sysfs_bus_id(g.pci_bus_id)}" for g in rootless)
        misfits.append(
            Misfit(
                "PcieRootUnknown",
                _gpus(rootless),
                f"{_gpus(rootless)}: no PCIe root in sysfs ({paths}); their devices are published "
                f"without {PCIE_ROOT}",
            )
        )
    return tuple(misfits)


def _gpus(gpus: Sequence[GpuInfo]) -> str:
    return f"GPU {gpus[0].index}" if len(gpus) == 1 else f"GPUs {','.join(str(g.index) for g in gpus)}"


def brand(product: str) -> str:
    return next((name for prefix, name in _BRANDS if product.startswith(prefix)), "Nvidia")


def architecture(major: int, minor: int) -> str:
    if major == 7:
        return "Volta" if minor < 5 else "Turing"
    if major == 8:
        return "Ada Lovelace" if minor >= 9 else "Ampere"
    return _ARCHITECTURES.get(major, "Unknown")


def semver(text: str) -> str:
    """`major.minor.patch` of a dotted version (missing parts 0, leading zeros dropped, as NVIDIA's
    driver normalises it: "535.104.05" -> "535.104.5"); "0.0.0" for text that is no version."""
    parts = (text.split(".") + ["0", "0"])[:3]
    if not all(p.isdigit() for p in parts):
        return "0.0.0"
    return ".".join(str(int(p)) for p in parts)


def pcie_bus_id(bus_id: str) -> str:
    """NVML's bus id as go-nvlib prints it: lower case, the 8-digit domain cut to 4 digits."""
    text = bus_id.lower()
    return text[4:] if text.startswith("0000") and len(text.split(":")[0]) == 8 else text


def quantity(value: int) -> dict[str, str]:
    """A capacity in Kubernetes' canonical binary form: 40Gi, 4864Mi, 14 (a count)."""
    if value > 0:
        for suffix, size in _BINARY_SUFFIXES:
            if value % size == 0:
                return {"value": f"{value // size}{suffix}"}
    return {"value": str(value)}
