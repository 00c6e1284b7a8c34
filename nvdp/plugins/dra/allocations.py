"""The DRA plugin's allocations file, `<plugin dir>/allocations.json` beside the hand-over records, for
the device plugin's /allocations and `nvdp status` on a node split between the APIs:

    {"driver": "gpu.nvidia.com", "writtenAt": "...", "devices": [{"device": "gpu-0", "gpu": "GPU-...",
      "uuid": "GPU-...", "index": "0", "advertised": true, "health": "Healthy", "share": "MPS: ...",
      "claims": [{"namespace", "name", "uid"}], "pods": [{..., "container": "", "claim": "ns/train"}]}]}

- One entry per device of the slices, and per device a prepared claim holds that they no longer
  list (`advertised: false`); holders are the claims and their pods, as last read.
- `share`: a MIG device's profile and memory slices, or the sharing a claim's config applied.
- Written atomically when changed, removed at stop; read by `nvdp.plugins.ledger.dra_file`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nvdp.base.files import write_atomic
from nvdp.base.logs import log_event
from nvdp.plugins.dra.checkpoint import PreparedClaim
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.health import DeviceHealth
from nvdp.plugins.dra.names import DRIVER_NAME, MIG_TYPE
from nvdp.plugins.dra.node_state import rfc3339
from nvdp.plugins.ledger.dra_file import ALLOCATIONS_FILE as ALLOCATIONS_FILE  # where the file goes

log = logging.getLogger(__name__)

Pod = tuple[str, str | None]


def dra_devices(
    devices: Sequence[DraDevice],
    health: Sequence[DeviceHealth],
    claims: Mapping[str, PreparedClaim],
    pods_of: Callable[[str], Sequence[Pod]],
    shares: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The devices' entries (pure). `shares`: device name -> the sharing a claim's config applied."""
    by_name = {d.name: d for d in devices}
    by_name.update({d.former_name: d for d in devices if d.former_name})
    state = {h.device: h for h in health}
    held: dict[str, list[PreparedClaim]] = {}
    for claim in claims.values():
        for prepared in claim.devices:
            found = by_name.get(prepared.device_name)
            held.setdefault(found.name if found else prepared.device_name, []).append(claim)
    entries = []
    for name in [*(d.name for d in devices), *(n for n in held if n not in {d.name for d in devices})]:
        device = by_name.get(name)
        known = state.get(name)
        entry: dict[str, Any] = {
            "device": name,
            "gpu": device.gpu_uuid if device else None,
            "uuid": device.uuid if device else None,
            "index": _index(device) if device else None,
            "advertised": device is not None,
            "health": "Unknown" if known is None else "Healthy" if known.healthy else "Unhealthy",
        }
        if known is not None and not known.healthy:
            entry["reason"] = known.message or "unknown"
        share = "; ".join(filter(None, (_partition(device) if device else "", shares.get(name, ""))))
        if share:
            entry["share"] = share
        mine = list({c.uid: c for c in held.get(name, [])}.values())
        entry["claims"] = [{"namespace": c.namespace, "name": c.name, "uid": c.uid} for c in mine]
        entry["pods"] = [
            {
                "namespace": c.namespace,
                "name": pod,
                "uid": uid,
                "container": "",
                "claim": f"{c.namespace}/{c.name}",
            }
            for c in mine
            for pod, uid in pods_of(c.uid)
        ]
        entries.append(entry)
    return entries


def _index(device: DraDevice) -> str:
    index = device.attributes.get("index", {}).get("int")
    parent = device.attributes.get("parentIndex", {}).get("int")
    return f"{parent}:{index}" if parent is not None else str(index)


def _partition(device: DraDevice) -> str:
    """A MIG device's profile and memory slices (its placement)."""
    if device.type != MIG_TYPE:
        return ""
    profile = device.attributes.get("profile", {}).get("string", "?")
    slices = sorted(
        int(k.removeprefix("memorySlice")) for k in device.capacity if k.startswith("memorySlice")
    )
    where = f", memory slices {slices[0]}-{slices[-1]}" if slices else ""
    return f"MIG {profile}{where}"


class AllocationsFile:
    """Writes the document to `path` when it changed; `remove()` at stop."""

    def __init__(self, path: Path, build: Callable[[], list[dict[str, Any]]]) -> None:
        self.path = path
        self._build = build
        self._last: list[dict[str, Any]] | None = None

    def write(self) -> None:
        devices = self._build()
        if devices == self._last:
            return
        document = {"driver": DRIVER_NAME, "writtenAt": rfc3339(time.time()), "devices": devices}
        try:
            write_atomic(self.path, (json.dumps(document, indent=1) + "\n").encode())
        except OSError as error:
            self._cannot("write", error)
            return
        self._last = devices

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as error:
            self._cannot("remove", error)

    def _cannot(self, what: str, error: OSError) -> None:
        log_event(
            log, logging.WARNING, f"cannot {what} the DRA allocations", path=str(self.path), error=str(error)
        )
