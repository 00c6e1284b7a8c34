"""Choosing devices that share a parent: replicas of one device, MIG devices of one GPU (pure).

NVIDIA's `sharedDevicesAllocationPolicy` (internal/rm/allocate.go, greedy over physical devices):

- a *group* is what the request's devices share: the device a replica (`<uuid>::<n>`) replicates,
  or the parent GPU of a MIG device. Each group counts its devices *in use*: those of the resource
  that are neither available nor candidates of this request (so `must_include` devices count as in
  use, as the kubelet passes them: in the request but not free for the policy to choose);
- the request takes one device at a time from the best group, which then counts one more in use:
  - DISTRIBUTED (the default): the group with the fewest in use, so a request and successive
    requests spread over the least-used parents;
  - PACKED: the group with the most in use, so the most-used parent fills first and whole parents
    stay free for later requests;
- ties: the group this request has taken fewer devices from (`must_include` counted), then a group
  on a NUMA node the request already touches (nvdp's addition; NVIDIA has no NUMA tie-break), then
  the lowest group (GPU order). Within a group devices are taken in device order.
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
