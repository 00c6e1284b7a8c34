"""Synthetic nodes for benchmarks and tests: regular PCIe/NVLink hierarchies of any size (pure)."""

from __future__ import annotations

from itertools import combinations

from nvdp.node.gpus.devices import Device
from nvdp.node.nvml.types import GpuLink, PcieLevel
from nvdp.plugins.deviceplugin.allocation.topology import Topology


def gpu_devices(uuids: list[str], numa_nodes: list[int | None]) -> list[Device]:
    """Whole-GPU devices, GPU i being uuids[i]."""
    return [
        Device(
            id=uuid,
            uuid=uuid,
            index=str(i),
            gpu_uuid=uuid,
            gpu_index=i,
            numa_node=node,
            paths=(f"/dev/nvidia{i}",),
            memory_bytes=80 << 30,
        )
        for i, (uuid, node) in enumerate(zip(uuids, numa_nodes, strict=True))
    ]


def hierarchical_node(
    count: int, *, per_numa: int, per_switch: int, nvlink_group: int, nvlinks: int
) -> tuple[list[Device], Topology]:
    """`count` GPUs: NUMA nodes of `per_numa`, PCIe switches of `per_switch` (SINGLE), switch pairs
    under one upstream switch (MULTIPLE), the rest of a NUMA node NODE, across nodes SYSTEM; GPUs in
    one block of `nvlink_group` share `nvlinks` NVLinks (an NVSwitch, or a bridge for groups of 2)."""
    uuids = [f"GPU-5e000000-0000-4000-8000-{i:012d}" for i in range(count)]
    numa: list[int | None] = [i // per_numa for i in range(count)]

    def pcie(a: int, b: int) -> PcieLevel:
        if numa[a] != numa[b]:
            return PcieLevel.SYSTEM
        if a // per_switch == b // per_switch:
            return PcieLevel.SINGLE
        if a // (2 * per_switch) == b // (2 * per_switch):
            return PcieLevel.MULTIPLE
        return PcieLevel.NODE

    links = {
        (uuids[a], uuids[b]): GpuLink(nvlinks if a // nvlink_group == b // nvlink_group else 0, pcie(a, b))
        for a, b in combinations(range(count), 2)
    }
    return gpu_devices(uuids, numa), Topology(dict(zip(uuids, numa, strict=True)), links)
