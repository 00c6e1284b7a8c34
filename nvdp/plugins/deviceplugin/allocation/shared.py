"""Choosing devices that share a parent: replicas of one device, MIG devices of one GPU (pure).

It follows NVIDIA's `sharedDevicesAllocationPolicy` (internal/rm/allocate.go):
- A group is what devices share: the device a replica (`<uuid>::<n>`) replicates, or a MIG
  device's parent GPU.
- A group's devices in use are the resource's devices that are neither available nor candidates,
  so `must_include` devices count as in use, as the kubelet passes them.
- The request takes one device at a time from the best group, which then counts one more in use.
- DISTRIBUTED (default) picks the group with the fewest in use; PACKED the most, keeping whole
  parents free.
- Ties: fewer devices taken by this request (`must_include` counted), then a NUMA node the request
  already touches (nvdp's addition), then the lowest group; within a group, device order.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

NO_NUMA = -1


class AllocationPolicy(enum.Enum):
    """`flags.plugin.sharedDevicesAllocationPolicy` values."""

    DISTRIBUTED = "distributed"
    PACKED = "packed"


def choose_shared(
    groups: Sequence[int],
    group_sizes: Sequence[int],
    group_numa: Sequence[int],
    candidates: Sequence[int],
    must: Sequence[int],
    need: int,
    policy: AllocationPolicy,
) -> list[int]:
    """`need` device positions from `candidates` (sorted positions, required ones excluded).

    `groups[position]` is each device's group (numbered in GPU order); `group_sizes[g]` counts every
    device of group g in the resource; `group_numa[g]` is its NUMA node (NO_NUMA when unknown).
    """
    free: dict[int, list[int]] = {}
    for position in candidates:
        free.setdefault(groups[position], []).append(position)
    in_use = {g: group_sizes[g] - len(left) for g, left in free.items()}
    picked = dict.fromkeys(free, 0)
    touched = {group_numa[groups[p]] for p in must}
    for position in must:
        if groups[position] in picked:
            picked[groups[position]] += 1
    sign = 1 if policy is AllocationPolicy.DISTRIBUTED else -1
    taken = dict.fromkeys(free, 0)
    chosen: list[int] = []
    while len(chosen) < need:
        g = min(
            (g for g in free if taken[g] < len(free[g])),
            key=lambda g: (sign * in_use[g], picked[g], group_numa[g] not in touched, g),
        )
        chosen.append(free[g][taken[g]])
        taken[g] += 1
        in_use[g] += 1
        picked[g] += 1
        touched.add(group_numa[g])
    return chosen
