"""The DRA plugin's allocations file as the device plugin reads it (`nvdp.plugins.dra.allocations` writes it).

- Found at `<kubelet dir>/../plugins/gpu.nvidia.com/allocations.json`; read bounded.
- Its devices are listed on /allocations under the driver's name, beside the device plugin's own.
- A file not there or not readable is no DRA section (said at debug level: the DRA plugin may not
  run on this node).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

ALLOCATIONS_FILE = "allocations.json"
MAX_FILE_BYTES = 4 << 20


def read_dra_allocations(path: Path) -> tuple[str, list[dict[str, Any]]] | None:
    """The DRA driver's name and its device entries at `path`; None when there is no such file or it
    cannot be read (said at debug level: the DRA plugin may not run on this node)."""
    if not path.exists():
        return None
    try:
        document = loads_json(read_bounded(path, MAX_FILE_BYTES), max_bytes=MAX_FILE_BYTES)
    except (UnreadableFile, ValueError) as error:
        log_event(log, logging.DEBUG, "DRA allocations unreadable", path=str(path), error=str(error))
        return None
    if not isinstance(document, dict):
        return None
    driver, devices = document.get("driver"), document.get("devices")
    if not isinstance(driver, str) or not driver or not isinstance(devices, list):
        return None
    return driver, [d for d in devices if isinstance(d, dict)]


def dra_resource(devices: Sequence[Mapping[str, Any]], pods: bool) -> list[dict[str, Any]]:
    """The DRA plugin's entries as the /allocations page lists a resource's devices: without `pods`
    (a client --pod-detail does not allow), how many pods hold each device, and no claim names."""
    if pods:
        return [dict(d) for d in devices]
    shown = []
    for device in devices:
        entry = {k: v for k, v in device.items() if k not in ("pods", "claims")}
        held = device.get("pods")
        entry["holders"] = len(held) if isinstance(held, list) else 0
        shown.append(entry)
    return shown
