"""A stopped side's holds, recovered from what the other side can prove once its record and lock are
gone (a cleaned directory) past LOST_GRACE_S: GPU uuid -> holder, or a one-line reason it cannot be
proven (then the stopped side stays unknown).

- The DRA driver reads the kubelet's PodResources API (`<kubelet root>/pod-resources/kubelet.sock`,
  the kubelet root two levels above its directory): the devices of `nvidia.com/*` resources that
  containers hold, located among the node's GPUs as the device plugin's own ledger does (an ID of
  another plugin's making, which no GPU of the node names, is no GPU of this hand-over).
- The device plugin reads the DRA driver's checkpoint (`checkpoint.json` in the same directory, bounded
  and never set aside from here): each prepared device's name (`gpu-<minor>...`) names its GPU. A
  checkpoint that is missing or unreadable, or a device that names no GPU of the node, proves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from nvdp.bounded import loads_json
from nvdp.dra.checkpoint import FORMAT, MAX_CHECKPOINT_BYTES
from nvdp.dra.names import CHECKPOINT_FILE
from nvdp.errors import PodResourcesUnavailable, UnreadableFile
from nvdp.files import read_bounded
from nvdp.ledger.locate import locate
from nvdp.ledger.podresources import POD_RESOURCES_DIR, POD_RESOURCES_SOCKET, PodResourcesClient
from nvdp.nvml.types import GpuInfo

DEVICE_PLUGIN_RESOURCES = "nvidia.com/"
_GPU_OF_DEVICE = re.compile(r"gpu-(\d+)(?:-|$)")

Proven = dict[str, str] | str  # GPU uuid -> holder, or why nothing could be proven


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


def dra_holds(directory: Path, gpus: Sequence[GpuInfo]) -> Proven:
    """For the device plugin: the claims holding GPUs through the DRA driver whose directory is
    `directory`, as its checkpoint says."""
    path = directory / CHECKPOINT_FILE
    by_minor = {gpu.minor: gpu.uuid for gpu in gpus}
    try:
        data = loads_json(read_bounded(path, MAX_CHECKPOINT_BYTES), max_bytes=MAX_CHECKPOINT_BYTES)
        if not isinstance(data, dict) or data.get("version") != FORMAT:
            raise ValueError(f"not an nvdp checkpoint (version {FORMAT})")
        holds: dict[str, str] = {}
        for uid, claim in dict(data["claims"]).items():
            holder = (
                f"claim {claim['namespace']}/{claim['name']}" if claim.get("namespace") else f"claim {uid}"
            )
            for device in claim["devices"]:
                name = str(device["device_name"])
                found = _GPU_OF_DEVICE.match(name)
                if found is None or int(found[1]) not in by_minor:
                    return f"{path}: device {name} names no GPU of this node"
                holds.setdefault(by_minor[int(found[1])], holder)
    except UnreadableFile as error:
        return str(error)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{path}: {error}"
    return holds
