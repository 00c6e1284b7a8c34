"""GPU link topology as plain data, and the pair score that ranks links.

A pair of GPUs scores by its PCIe relation (nvmlGpuTopologyLevel_t): INTERNAL (same board) 60,
SINGLE (one switch) 50, MULTIPLE (several switches) 40, HOSTBRIDGE 30, NODE (same NUMA node) 20,
SYSTEM (across CPUs) 10; plus 100 per NVLink. A set's score is the sum over its pairs.

- One NVLink (>= 110) outranks any PCIe relation (<= 60); n + 1 links outrank n links.
- Between equal link counts the PCIe relation decides.
- The magnitudes are go-gpuallocator's, so scores compare with NVIDIA's answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Protocol

from nvdp.base.errors import NvmlError
from nvdp.node.nvml.types import GpuInfo, GpuLink, PcieLevel

NVLINK_SCORE = 100
PCIE_SCORE: Mapping[PcieLevel, int] = {
    PcieLevel.INTERNAL: 60,
    PcieLevel.SINGLE: 50,
    PcieLevel.MULTIPLE: 40,
    PcieLevel.HOSTBRIDGE: 30,
    PcieLevel.NODE: 20,
    PcieLevel.SYSTEM: 10,
}


class LinkSource(Protocol):
    """The part of the NVML facade (`nvdp.node.nvml.types.Nvml`) a topology is read from."""

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink: ...


def pair_score(link: GpuLink) -> int:
    """The score of one GPU pair: NVLink above every PCIe relation, then closest PCIe first."""
    return NVLINK_SCORE * link.nvlinks + PCIE_SCORE[link.pcie]


class Topology:
    """Per-GPU NUMA node and pairwise links, keyed by GPU uuid.

    `links` may hold each pair in either order (not both, unless equal). A pair without an entry
    is taken as PCIe-only: NODE when both GPUs report the same NUMA node, else SYSTEM.
    """

    def __init__(
        self, numa_nodes: Mapping[str, int | None], links: Mapping[tuple[str, str], GpuLink]
    ) -> None:
        self.numa_nodes: dict[str, int | None] = dict(numa_nodes)
        self._links: dict[frozenset[str], GpuLink] = {}
        for (a, b), link in links.items():
            if a == b:
                raise ValueError(f"link from GPU {a} to itself")
            key = frozenset((a, b))
            if self._links.setdefault(key, link) != link:
                raise ValueError(f"conflicting links between {a} and {b}")

    @classmethod
    def from_nvml(cls, nvml: LinkSource, gpus: Sequence[GpuInfo]) -> Topology:
        """Read every pair's link through the facade (N*(N-1)/2 calls; done once per device set)."""
        links = {}
        for a, b in combinations(gpus, 2):
            try:
                links[(a.uuid, b.uuid)] = nvml.link(a.uuid, b.uuid)
            except NvmlError:  # a GPU that does not answer (lost): scored by NUMA node only
                continue
        return cls({g.uuid: g.numa_node for g in gpus}, links)

    @property
    def links(self) -> dict[tuple[str, str], GpuLink]:
        """Every known link, each pair once (in sorted uuid order)."""
        result: dict[tuple[str, str], GpuLink] = {}
        for pair, link in self._links.items():
            a, b = sorted(pair)
            result[(a, b)] = link
        return result

    def link(self, a: str, b: str) -> GpuLink:
        found = self._links.get(frozenset((a, b)))
        if found is not None:
            return found
        na, nb = self.numa_nodes.get(a), self.numa_nodes.get(b)
        same_node = na is not None and na == nb
        return GpuLink(0, PcieLevel.NODE if same_node else PcieLevel.SYSTEM)

    def set_score(self, uuids: Iterable[str]) -> int:
        """The sum of pair scores over every pair in `uuids`."""
        return sum(pair_score(self.link(a, b)) for a, b in combinations(list(uuids), 2))

    def __repr__(self) -> str:
        return f"Topology({len(self.numa_nodes)} GPUs, {len(self._links)} links)"
