"""This node's DRA devices with the attributes and capacities NVIDIA's DRA driver publishes (pure).

A GPU without MIG is one device of type `gpu`; a MIG-enabled GPU is its MIG devices, each of type
`mig` (the GPU itself is not offered while MIG is on, as NVIDIA's driver does). The attribute names,
value kinds and capacity names are NVIDIA's, so that its DeviceClasses and users' selectors match:

- gpu: `type`, `uuid`, `index`, `minor`, `productName`, `brand`, `architecture`,
  `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion` (versions as semver: `8.0.0`),
  `pcieBusID` (NVML's bus id, lower case, domain of 4 digits: `0000:07:00.0`); capacity `memory`.
- mig: `type`, `uuid`, `index` (the MIG device's), `parentUUID`, `parentIndex`, `parentMinor`,
  `profile`, and the parent's product, brand, architecture, versions and bus id; capacities
  `memory`, `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`
  and `memorySlice<N>` (1 for each memory slice its GPU instance sits on).

`brand` is read from the product name (NVML's brand query is not in the facade): Tesla, Quadro,
QuadroRTX, GeForce, GeForceRTX, Titan, TitanRTX, NvidiaRTX, else Nvidia. `architecture` is the
compute capability's: Volta, Turing, Ampere, Ada Lovelace, Hopper, Blackwell, ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nvdp.devices import gpu_device, mig_device
from nvdp.dra.names import GPU_TYPE, MIG_TYPE, gpu_device_name, mig_device_name
from nvdp.nvml.types import GpuInfo, MigDeviceInfo

Attributes = dict[str, dict[str, Any]]  # name -> {"string" | "int" | "bool" | "version": value}

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

    @property
    def type(self) -> str:
        return str(self.attributes["type"]["string"])

    def slice_entry(self) -> dict[str, Any]:
        """The device as a ResourceSlice (resource.k8s.io/v1) lists it."""
        return {"name": self.name, "attributes": self.attributes, "capacity": self.capacity}


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
                "index": {"int": gpu.index},
                "minor": {"int": gpu.minor},
                **common,
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
        "index": {"int": mig.index},
        "parentUUID": {"string": gpu.uuid},
        "parentIndex": {"int": gpu.index},
        "parentMinor": {"int": gpu.minor},
        "profile": {"string": mig.profile},
        **common,
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
    return DraDevice(mig_device_name(gpu, mig), mig.uuid, gpu.uuid, paths, attributes, capacity)


def _common(gpu: GpuInfo, facts: DriverFacts) -> Attributes:
    major, minor = gpu.compute_capability
    return {
        "productName": {"string": gpu.name},
        "brand": {"string": brand(gpu.name)},
        "architecture": {"string": architecture(major, minor)},
        "cudaComputeCapability": {"version": semver(f"{major}.{minor}")},
        "driverVersion": {"version": semver(facts.driver_version)},
        "cudaDriverVersion": {"version": semver(facts.cuda_driver_version)},
        "pcieBusID": {"string": pcie_bus_id(gpu.pci_bus_id)},
    }


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
