"""What of a ResourceClaim is this driver's on this node (pure): the claim the kubelet names must be
the one the API has (its UID), allocated, and its `status.allocation.devices.results` for the driver
`gpu.nvidia.com` and this node's pool are the devices to prepare. Results of other drivers and pools
are someone else's (a claim may span drivers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nvdp.dra.names import DRIVER_NAME
from nvdp.errors import NvdpError


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
    """One allocation result of this driver and pool: the claim's request and the device."""

    request: str
    device: str


def allocated_devices(claim: Mapping[str, Any] | None, ref: ClaimRef, pool: str) -> list[Allocated]:
    """The devices of `claim` (as the API has it; None: not found) that this driver prepares in `pool`.
    Raises ClaimError when the claim is gone, is another claim of the same name, or is not allocated."""
    if claim is None:
        raise ClaimError(f"ResourceClaim {ref} not found")
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(f"ResourceClaim {ref} has UID {uid}, not {ref.uid}: deleted and created again?")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        Allocated(str(r.get("request") or ""), str(r.get("device")))
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == DRIVER_NAME and r.get("pool") == pool
    ]
