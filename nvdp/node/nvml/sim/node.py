"""The simulated node's value types: its GPUs' fixed facts and how they are connected (pure).

`nvdp.node.nvml.sim.spec` builds a `SimNode` from a profile or node file; `nvdp.node.nvml.sim.backend` serves
it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from nvdp.node.nvml.sim.mig import MigGeometry
from nvdp.node.nvml.types import GpuFabric, PcieLevel


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU's fixed facts (its MIG layout is the initial one; it may change at run time)."""

    index: int
    uuid: str
    name: str
    minor: int
    memory_mib: int
    compute_capability: tuple[int, int]
    pci_bus_id: str
    numa_node: int | None
    ecc: bool
    mig_capable: bool
    mig_geometry: MigGeometry
    mig: tuple[str, ...] | None  # None: MIG disabled
    lost: bool = False  # lost from the start: its queries fail with NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True)
class SimNode:
    """A simulated node: its GPUs and how they are connected (PCIe, NVLink, an NVLink fabric)."""

    name: str
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[SimGpu, ...]
    nvswitch_links: int = 0  # NVLinks between every pair of GPUs through NVSwitches
    nvlink_bridges: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (i, j), i < j
    pcie_levels: Mapping[tuple[int, int], PcieLevel] = field(default_factory=dict)  # explicit, i < j
    fabric: Mapping[int, GpuFabric] = field(default_factory=dict)  # GPU index -> NVLink fabric info

    def nvlinks(self, i: int, j: int) -> int:
        return self.nvswitch_links + self.nvlink_bridges.get((min(i, j), max(i, j)), 0)

    def pcie_root(self, i: int) -> str:
        """GPU i's PCIe root complex, `pci<domain>:<bus>`, from the bus ids: the GPUs that `pcie` puts
        behind one host bridge or closer (INTERNAL .. HOSTBRIDGE) share one root, whose bus is one
        below the lowest bus among them (a GPU without such peers: one below its own)."""
        group, todo = {i}, [i]
        while todo:
            k = todo.pop()
            for (a, b), level in self.pcie_levels.items():
                if (
                    level <= PcieLevel.HOSTBRIDGE
                    and k in (a, b)
                    and (peer := b if k == a else a) not in group
                ):
                    group.add(peer)
                    todo.append(peer)
        domain, bus = min(_domain_bus(self.gpus[k].pci_bus_id) for k in group)
        return f"pci{domain:04x}:{max(bus - 1, 0):02x}"

    def pcie(self, i: int, j: int) -> PcieLevel:
        level = self.pcie_levels.get((min(i, j), max(i, j)))
        if level is not None:
            return level
        a, b = self.gpus[i].numa_node, self.gpus[j].numa_node
        return PcieLevel.NODE if a is not None and a == b else PcieLevel.SYSTEM


def _domain_bus(bus_id: str) -> tuple[int, int]:
    """(domain, bus) of "00000000:07:00.0"."""
    domain, bus = bus_id.split(":")[:2]
    return int(domain, 16), int(bus, 16)


def derived_uuid(prefix: str, key: str) -> str:
    """A stable UUID in NVML's format (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) derived from key."""
    h = hashlib.sha256(key.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
