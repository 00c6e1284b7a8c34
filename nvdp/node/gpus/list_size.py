"""The kubelet's gRPC message limit applied to resources (pure): the encoded size of a resource's
ListAndWatch list, and the one line that says a resource's list would not fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from nvdp.node.gpus.devices import Device

# The kubelet receives ListAndWatch with gRPC's default 4 MiB message limit; a resource whose device
# list would not fit is refused with half of it as margin (the list's size is computed from the IDs).
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_LIST_AND_WATCH_BYTES = KUBELET_MAX_MESSAGE_BYTES // 2


class Listed(Protocol):
    """What the check reads of a resource (a `nvdp.node.gpus.resources.Resource` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> Mapping[str, Device]: ...
    @property
    def replicas(self) -> int: ...


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def list_and_watch_bytes(devices: Sequence[Device]) -> int:
    """The encoded size of the ListAndWatchResponse advertising `devices` (all Unhealthy: the
    longest health value), as protobuf lays it out: ID, health and NUMA topology per device."""
    total = 0
    for device in devices:
        id_len = len(device.id.encode())
        item = 1 + _varint_len(id_len) + id_len + 2 + len("Unhealthy")
        if device.numa_node is not None:
            node = 1 + _varint_len(device.numa_node) if device.numa_node else 0
            topology = 1 + _varint_len(node) + node
            item += 1 + _varint_len(topology) + topology
        total += 1 + _varint_len(item) + item
    return total


def oversized(resources: Sequence[Listed]) -> dict[str, str]:
    """Resource name -> why, for every resource whose ListAndWatch list would not fit the kubelet's
    limit."""
    problems = {}
    for resource in resources:
        size = list_and_watch_bytes(list(resource.devices.values()))
        if size > MAX_LIST_AND_WATCH_BYTES:
            problems[resource.name] = (
                f"{resource.name}: {len(resource.devices)} devices make a {size}-byte ListAndWatch list, "
                f"over nvdp's limit of {MAX_LIST_AND_WATCH_BYTES} bytes (half the kubelet's "
                f"{KUBELET_MAX_MESSAGE_BYTES}-byte gRPC message limit): lower the sharing replicas"
                + (
                    f" (at most {resource.replicas * MAX_LIST_AND_WATCH_BYTES // size} here)"
                    if resource.replicas > 1
                    else ""
                )
            )
    return problems
