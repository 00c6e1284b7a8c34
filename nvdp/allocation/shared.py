"""Choosing devices that share a parent: replicas of one GPU, MIG devices of one GPU (pure).

Replicas (`<uuid>::<n>`) are grouped by the device they replicate. SPREAD (the default, as
NVIDIA's plugin does for time-slicing) takes each replica from the group with the fewest replicas in
use, where in use means not available or required by this request; PACK takes from the group with
the most in use, keeping whole groups free for later requests. Ties go to the lowest group.

MIG devices are packed: first the parents of the required devices, then parents on a NUMA node
already used, then a new NUMA node. A new NUMA node or parent is chosen best-fit: the one with the
fewest free devices that still covers what is left, else the one with the most.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence


class ReplicaPolicy(enum.Enum):
    SPREAD = "spread"
    PACK = "pack"


def choose_replicas(
    groups: Sequence[int],
    group_sizes: Sequence[int],
    candidates: Sequence[int],
    need: int,
    policy: ReplicaPolicy,
) -> list[int]:
    """`need` device positions from `candidates` (sorted positions, required ones excluded).

    `groups[position]` is each device's group; `group_sizes[g]` counts every device of group g.
    """
    free: dict[int, list[int]] = {}
    for position in candidates:
        free.setdefault(groups[position], []).append(position)
    sign = 1 if policy is ReplicaPolicy.SPREAD else -1
    heap = [(sign * (group_sizes[g] - len(left)), g) for g, left in free.items()]
    heapq.heapify(heap)
    taken = {g: 0 for g in free}
    chosen: list[int] = []
    while len(chosen) < need:
        used, g = heap[0]
        chosen.append(free[g][taken[g]])
        taken[g] += 1
        if taken[g] == len(free[g]):
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (used + sign, g))
    return chosen


def choose_packed(
    parents: Sequence[int],
    parent_numa: Sequence[int],
    candidates: Sequence[int],
    must: Sequence[int],
    need: int,
) -> list[int]:
    """`need` device positions from `candidates`, packed onto few parents and NUMA nodes.

    `parents[position]` is a device's parent GPU (ordered by GPU index); `parent_numa[parent]` its
    NUMA node.
    """
    free: dict[int, list[int]] = {}
    for position in candidates:
        free.setdefault(parents[position], []).append(position)
    used_parents = {parents[p] for p in must}
    used_nodes = {parent_numa[g] for g in used_parents}
    chosen: list[int] = []

    def take(g: int) -> None:
        left = need - len(chosen)
        chosen.extend(free.pop(g)[:left])
        used_nodes.add(parent_numa[g])

    for g in sorted(used_parents & free.keys()):
        if len(chosen) < need:
            take(g)
    while len(chosen) < need:
        left = need - len(chosen)
        pool = [g for g in free if parent_numa[g] in used_nodes]
        if not pool:
            node_free: dict[int, int] = {}
            for g, devices in free.items():
                node_free[parent_numa[g]] = node_free.get(parent_numa[g], 0) + len(devices)
            node = _best_fit(node_free, left)
            pool = [g for g in free if parent_numa[g] == node]
        take(_best_fit({g: len(free[g]) for g in pool}, left))
    return chosen


def _best_fit(sizes: dict[int, int], want: int) -> int:
    """The key whose size is the smallest still >= want, else the largest; ties to the lowest key."""
    fits = [k for k, size in sizes.items() if size >= want]
    if fits:
        return min(fits, key=lambda k: (sizes[k], k))
    return min(sizes, key=lambda k: (-sizes[k], k))
