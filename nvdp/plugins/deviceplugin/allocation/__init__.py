"""Preferred allocation (GetPreferredAllocation): topology scoring and sharing policies (pure).

`Allocator(devices, topology).preferred(available, must_include, size)` is all the plugin server
calls; `Topology` and `pair_score` are the scoring, exposed for tests, benchmarks and tools.
"""

from nvdp.plugins.deviceplugin.allocation.allocator import Allocator
from nvdp.plugins.deviceplugin.allocation.shared import AllocationPolicy
from nvdp.plugins.deviceplugin.allocation.topology import NVLINK_SCORE, PCIE_SCORE, Topology, pair_score

__all__ = ["NVLINK_SCORE", "PCIE_SCORE", "AllocationPolicy", "Allocator", "Topology", "pair_score"]
