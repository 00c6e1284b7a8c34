"""GetPreferredAllocation for one resource: validate the request, then apply its devices' policy.

- Whole GPUs: topology score, fewest NUMA nodes, least fragmentation, lowest index (`gpus`).
- Replicas (`<uuid>::<n>`) and MIG devices: NVIDIA's `sharedDevicesAllocationPolicy`, DISTRIBUTED
  (default) or PACKED, over the replicated devices or the MIG devices' parent GPUs (`shared`).
- Per-device-set data (order, weights, groups) is computed once, in `Allocator.__init__`.
- Duplicate IDs in `available` or `must_include` are dropped silently: the kubelet means sets.
- The answer lists device IDs in device order (GPU index, MIG index, replica).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from nvdp.base.errors import RequestError
from nvdp.node.gpus.devices import Device, format_ids
from nvdp.plugins.deviceplugin.allocation.gpus import choose_gpus
from nvdp.plugins.deviceplugin.allocation.shared import NO_NUMA, AllocationPolicy, choose_shared
from nvdp.plugins.deviceplugin.allocation.topology import Topology, pair_score


class Allocator:
    """Preferred allocations over one resource's devices.

    `topology` gives whole-GPU links and NUMA nodes; without it (or for a GPU it lacks) the
    devices' NUMA nodes are used and links are taken as PCIe-only (see `Topology.link`).
    """

    def __init__(
        self,
        devices: Iterable[Device],
        topology: Topology | None = None,
        *,
        policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED,
    ) -> None:
        ordered = sorted(devices, key=lambda d: d.order)
        self._ids = [d.id for d in ordered]
        self._position = {device_id: p for p, device_id in enumerate(self._ids)}
        if len(self._position) != len(self._ids):
            raise ValueError("duplicate device IDs")
        self.policy = policy
        gpu_uuids = [d.gpu_uuid for d in ordered]
        replicated = any(d.replica is not None for d in ordered)
        if replicated or any(d.is_mig for d in ordered) or len(set(gpu_uuids)) != len(gpu_uuids):
            # Replicas group by the device they replicate, MIG devices by their parent GPU.
            self.kind: Literal["gpus", "replicas", "mig"] = "replicas" if replicated else "mig"
            keys = [d.uuid for d in ordered] if replicated else gpu_uuids
            groups: dict[str, int] = {}
            self._groups = [groups.setdefault(k, len(groups)) for k in keys]
            sizes = Counter(self._groups)
            self._group_sizes = [sizes[g] for g in range(len(groups))]
            self._group_numa = [NO_NUMA] * len(groups)
            for d, g in zip(ordered, self._groups, strict=True):
                self._group_numa[g] = _numa(d, topology)
        else:
            self.kind = "gpus"
            numa = {d.gpu_uuid: d.numa_node for d in ordered}
            if topology is not None:
                numa.update({u: n for u, n in topology.numa_nodes.items() if n is not None})
            topo = Topology(numa, topology.links if topology is not None else {})
            self._numa = [_numa(d, topo) for d in ordered]
            self._weights = [
                [0 if a == b else pair_score(topo.link(a, b)) for b in gpu_uuids] for a in gpu_uuids
            ]

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """Exactly `size` IDs from `available`, with every `must_include`; raises RequestError."""
        avail = list(dict.fromkeys(available))
        must = list(dict.fromkeys(must_include))
        position = self._position
        for field, ids in (("available", avail), ("must_include", must)):
            unknown = [i for i in ids if i not in position]
            if unknown:
                raise RequestError(f"unknown device IDs in {field}: {format_ids(unknown)}")
        if size < 1:
            raise RequestError(f"allocation_size must be at least 1, got {size}")
        avail_set = set(avail)
        missing = [i for i in must if i not in avail_set]
        if missing:
            raise RequestError(f"must_include devices not in available: {format_ids(missing)}")
        if size > len(avail):
            plural = "" if len(avail) == 1 else "s"
            raise RequestError(f"allocation_size {size} exceeds the {len(avail)} available device{plural}")
        if len(must) > size:
            raise RequestError(f"must_include has {len(must)} devices, more than allocation_size {size}")

        avail_pos = sorted(position[i] for i in avail)
        must_pos = sorted(position[i] for i in must)
        if self.kind == "gpus":
            chosen = choose_gpus(self._weights, self._numa, avail_pos, must_pos, size)
        else:
            required = set(must_pos)
            candidates = [p for p in avail_pos if p not in required]
            need = size - len(must_pos)
            extra = choose_shared(
                self._groups,
                self._group_sizes,
                self._group_numa,
                candidates,
                must_pos,
                need,
                self.policy,
            )
            chosen = sorted(must_pos + extra)
        return [self._ids[p] for p in chosen]


def _numa(device: Device, topology: Topology | None) -> int:
    node = topology.numa_nodes.get(device.gpu_uuid) if topology is not None else None
    if node is None:
        node = device.numa_node
    return NO_NUMA if node is None else node
