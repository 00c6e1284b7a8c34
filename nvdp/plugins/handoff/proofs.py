"""A stopped side's holds, recovered from what the other side can prove once its record and lock are
gone (a cleaned directory) past LOST_GRACE_S.

The answer is GPU uuid -> holder, or a one-line reason it cannot be proven (the side stays unknown).
- The DRA driver reads the kubelet's PodResources API (`<kubelet root>/pod-resources/kubelet.sock`,
  the kubelet root two levels above its directory): the devices of `nvidia.com/*` resources that
  containers hold, located among the node's GPUs as the plugin's ledger does; an ID that no GPU of
  the node names is no GPU of this hand-over.
- The device plugin reads the DRA driver's checkpoint (`nvdp.plugins.dra.checkpoint.dra_holds`, handed to
  its `Handoff` by its wiring, so this package needs nothing of the DRA driver's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from nvdp.base.errors import PodResourcesUnavailable
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.ledger.locate import locate
from nvdp.plugins.ledger.podresources import POD_RESOURCES_DIR, POD_RESOURCES_SOCKET, PodResourcesClient

DEVICE_PLUGIN_RESOURCES = "nvidia.com/"

Proven = dict[str, str] | str  # GPU uuid -> holder, or why nothing could be proven
Prover = Callable[[Path, Sequence[GpuInfo]], Proven]  # the records' directory, the node's GPUs


def device_plugin_holds(directory: Path, gpus: Sequence[GpuInfo]) -> Proven:
    """For the DRA driver whose directory is `directory`: the pods holding GPUs through the device
    plugin, as the kubelet's PodResources API says."""
    client = PodResourcesClient(directory.parent.parent / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET)
    try:
        holdings = client.list(DEVICE_PLUGIN_RESOURCES)
    except PodResourcesUnavailable as error:
        return str(error)
    finally:
        client.close()
    holds: dict[str, str] = {}
    for holding in holdings:
        where = locate(holding.device_id, {}, gpus)
        if where is not None:
            holds.setdefault(where.gpu_uuid, f"pod {holding.pod_key}")
    return holds
