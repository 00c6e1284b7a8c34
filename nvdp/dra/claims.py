"""What of a ResourceClaim is this driver's on this node (pure): the claim the kubelet names must be
the one the API has (its UID), allocated, and its `status.allocation.devices.results` for the driver
`gpu.nvidia.com` and this node's pool are the devices to prepare. Results of other drivers and pools
are someone else's (a claim may span drivers). An opaque device config for this driver (NVIDIA's
GpuConfig / MigDeviceConfig: time-slicing, MPS) is refused: nvdp does not apply them, and a claim
must not get a device without the sharing it asked for."""

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
    devices = allocation.get("devices") or {}
    ours = [
        Allocated(str(r.get("request") or ""), str(r.get("device")))
        for r in devices.get("results") or []
        if isinstance(r, Mapping) and r.get("driver") == DRIVER_NAME and r.get("pool") == pool
    ]
    for config in devices.get("config") or []:
        opaque = config.get("opaque") if isinstance(config, Mapping) else None
        requests = set(config.get("requests") or []) if isinstance(config, Mapping) else set()
        if isinstance(opaque, Mapping) and opaque.get("driver") == DRIVER_NAME and ours:
            if not requests or any(
                a.request in requests or a.request.split("/")[0] in requests for a in ours
            ):
                kind = (opaque.get("parameters") or {}).get("kind", "opaque parameters")
                raise ClaimError(
                    f"ResourceClaim {ref}: its {kind} config for {DRIVER_NAME} is not supported by nvdp"
                )
    return ours
