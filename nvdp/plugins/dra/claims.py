"""What of a ResourceClaim is this driver's on this node (pure): the claim the kubelet names must be
the one the API has (its UID), allocated, and its `status.allocation.devices.results` for the driver
`gpu.nvidia.com` and this node's pool are the devices to prepare. Results of other drivers and pools
are someone else's (a claim may span drivers). The opaque device configs for this driver (NVIDIA's
GpuConfig / MigDeviceConfig: time-slicing, MPS) are `nvdp.plugins.dra.sharing`'s to read.

A claim's names are checked before they name a file or an API path (`ref_problem`: the namespace a DNS
label, the name a DNS subdomain, the UID letters, digits and `-`), and a claim whose shape is not a
ResourceClaim's (a list where a map belongs) is that claim's one-line error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nvdp.base.errors import NvdpError
from nvdp.plugins.dra.names import DRIVER_NAME

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class ClaimError(NvdpError):
    """A claim cannot be prepared (one line naming it); the other claims of the call go on."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Allocated:
    """One allocation result of this driver and pool: the claim's request and the device, and of a
    device shared by capacity the claim's share (`consumedCapacity`, None when the result has none)."""

    request: str
    device: str
    consumed_capacity: Mapping[str, object] | None = None
    share_id: str = ""


def ref_problem(ref: ClaimRef) -> str | None:
    """Why the kubelet's name of a claim cannot be one (one line), or None."""
    if not _DNS_LABEL.fullmatch(ref.namespace):
        return f"ResourceClaim namespace {ref.namespace!r} is not a DNS label"
    if len(ref.name) > 253 or not _DNS_SUBDOMAIN.fullmatch(ref.name):
        return f"ResourceClaim name {ref.name!r} (namespace {ref.namespace}) is not a DNS subdomain"
    if not _UID.fullmatch(ref.uid):
        return f"ResourceClaim {ref}: UID {ref.uid!r} is not letters, digits and '-'"
    return None


def allocated_devices(claim: object, ref: ClaimRef, pool: str) -> list[Allocated]:
    """The devices of `claim` (as the API has it; None: not found) that this driver prepares in `pool`.
    Raises ClaimError when the claim is gone, is another claim of the same name, is not allocated or
    is not shaped as a ResourceClaim."""
    if claim is None:
        raise ClaimError(f"ResourceClaim {ref} not found")
    obj = _map(claim, ref, "")
    uid = _map(obj.get("metadata"), ref, "metadata").get("uid")
    if uid != ref.uid:
        raise ClaimError(f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: deleted and created again?")
    allocation = _map(obj.get("status"), ref, "status").get("allocation")
    if allocation is None:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    devices = _map(
        _map(allocation, ref, "status.allocation").get("devices"), ref, "status.allocation.devices"
    )
    ours = [
        Allocated(
            _text(r.get("request"), ref, "request"),
            _text(r.get("device"), ref, "device"),
            _map(r.get("consumedCapacity"), ref, "an allocation result's consumedCapacity")
            if r.get("consumedCapacity") is not None
            else None,
            _text(r.get("shareID"), ref, "shareID"),
        )
        for r in _list(devices.get("results"), ref, "status.allocation.devices.results")
        if isinstance(r, Mapping) and r.get("driver") == DRIVER_NAME and r.get("pool") == pool
    ]
    for config in _list(devices.get("config"), ref, "status.allocation.devices.config"):
        config = _map(config, ref, "status.allocation.devices.config[]")
        _list(config.get("requests"), ref, "status.allocation.devices.config[].requests")
    return ours


def allocated_here(claim: object, pool: str) -> bool:
    """Whether the API's `claim` is allocated devices of this driver in `pool` and reserved for a pod
    (a claim a pod of this node may be running with)."""
    if not isinstance(claim, Mapping):
        return False
    status = claim.get("status")
    if not isinstance(status, Mapping) or not status.get("reservedFor"):
        return False
    allocation = status.get("allocation")
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return isinstance(results, list) and any(
        isinstance(r, Mapping) and r.get("driver") == DRIVER_NAME and r.get("pool") == pool for r in results
    )


def _map(value: object, ref: ClaimRef, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"ResourceClaim {ref}: {field or 'the object'} is not a map")
    return value


def _list(value: object, ref: ClaimRef, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ClaimError(f"ResourceClaim {ref}: {field} is not a list")
    return value


def _text(value: object, ref: ClaimRef, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ClaimError(f"ResourceClaim {ref}: an allocation result's {field} is not a string")
    return value
