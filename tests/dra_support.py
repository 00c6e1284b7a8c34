"""Test helpers for DRA: the node and cluster of `testkit.dra` (API stand-in, kubelet stand-in,
plugin process), and the kubelet's Node status writes."""

from __future__ import annotations

import time
from collections.abc import Callable

from nvdp.plugins.dra.publisher import SlicePublisher
from testkit.dra import (
    DEVICE_CLASSES,
    DRA_ALL_CONFIG,
    DRIVER,
    GROUP,
    NODE_UID,
    V1,
    DraCluster,
    claim_path,
    dra_cluster,
    make_claim,
    published,
    schedule,
    serve_dra,
    slices_of,
)
from testkit.kube_api_standin import KubeApiStandin

__all__ = [
    "DEVICE_CLASSES",
    "DRA_ALL_CONFIG",
    "DRIVER",
    "GROUP",
    "NODE_UID",
    "V1",
    "DraCluster",
    "claim_path",
    "dra_cluster",
    "make_claim",
    "node_status_writer",
    "published",
    "schedule",
    "serve_dra",
    "slices_of",
    "stop_publisher",
]


def node_status_writer(
    api: KubeApiStandin, node: str = "node-a"
) -> Callable[[dict[str, int], dict[str, int]], None]:
    """Write device counts into the Node's `status.capacity` and `status.allocatable` (a merge patch
    that also drops the resources no longer counted), as the kubelet's status update does."""
    path = f"/api/v1/nodes/{node}"

    def write(capacity: dict[str, int], allocatable: dict[str, int]) -> None:
        current = api.objects[path].get("status") or {}
        status = {
            key: {**dict.fromkeys(current.get(key) or {}), **{name: str(n) for name, n in counts.items()}}
            for key, counts in (("capacity", capacity), ("allocatable", allocatable))
        }
        api.merge_patch(path, {"status": status})

    return write


def stop_publisher(publisher: SlicePublisher, api: KubeApiStandin, timeout: float = 5.0) -> None:
    """Stop `publisher` and join its threads, ending the stand-in's watches until its watcher returned
    (one begun after an end would wait for the server's timeout): nothing of it outlives the test."""
    publisher.stop()
    deadline = time.monotonic() + timeout
    while not publisher.join(0.05) and time.monotonic() < deadline:
        api.end_watches()
    assert publisher.join(0), "the slice publisher's threads did not end"
