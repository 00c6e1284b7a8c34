"""Names and ids as NVIDIA spells them: MIG profile names and PCI bus ids (pure functions)."""

from __future__ import annotations

import math
import os

from nvdp.base.units import MIB

# GPU instance profiles whose MIG devices carry a name suffix (go-nvlib's spelling).
PROFILE_SUFFIXES = (
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


def pcie_root_of(link: str, bus_id: str) -> str | None:
    """The PCIe root complex (`pci0000:00`) of a PCI device from its sysfs link: the target of
    `/sys/bus/pci/devices/<id>` (`../../../devices/pci0000:00/0000:00:01.1/0000:07:00.0`) is the
    device's place in the hierarchy below /sys/devices, whose first element is the root. None for a
    target that is no such path or names another device."""
    if link.startswith("/"):
        path = os.path.normpath(link).removeprefix("/sys/")
    else:
        path = os.path.normpath(os.path.join("bus/pci/devices", link))
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "devices" or not parts[1].startswith("pci"):
        return None
    return parts[1] if parts[-1] == sysfs_bus_id(bus_id) else None
