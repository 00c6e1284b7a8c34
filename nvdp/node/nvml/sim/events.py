"""The language of the simulated node's injected events (`NVDP_SIM_EVENTS` lines): the accepted
fields, event names and value ranges, and the shape check every line passes before it is applied."""

from __future__ import annotations

import json
from collections.abc import Mapping

from nvdp.base.bounded import BoundExceeded, loads_json
from nvdp.node.nvml.types import EventType

ECC_EVENTS = {"single-bit-ecc": EventType.SINGLE_BIT_ECC, "double-bit-ecc": EventType.DOUBLE_BIT_ECC}
PROBE_EVENTS = {
    "retired-pages-pending": {"retired_pages_pending": True},
    "row-remap-pending": {"row_remap_pending": True},
    "row-remap-failure": {"row_remap_failure": True},
}
STATE_EVENTS = ("gpu-lost", "gpu-hung", "gpu-restored", "clear-pending", *PROBE_EVENTS)
EVENT_NAMES = ("wait-error", *ECC_EVENTS, *STATE_EVENTS)
FIELDS = ("uuid", "xid", "event", "mig", "compute-mode", "gi_id", "ci_id", "code")
XID_MAX = 2**64 - 1  # nvmlEventData_t.eventData is an unsigned long long
INSTANCE_MAX = 2**32 - 2  # unsigned int; 0xFFFFFFFF means "no instance"


class SimEventError(ValueError):
    """An injected event (or events-file line) the simulated node cannot apply.

    A ValueError, not an NvdpError, on purpose: the events-file follower logs and skips such a line,
    and `inject()`'s callers are tests; it never ends a command."""


def decode_event(event: Mapping[str, object] | str) -> Mapping[str, object]:
    """One events-file line (JSON text or decoded) checked for shape; SimEventError when it is off."""
    if isinstance(event, str):
        try:
            event = loads_json(event)
        except BoundExceeded as e:
            raise SimEventError(str(e)) from e
        except json.JSONDecodeError as e:
            raise SimEventError(f"not JSON: {e}") from e
    if not isinstance(event, Mapping):
        raise SimEventError("not a JSON object")
    unknown = [key for key in event if key not in FIELDS]
    if unknown:
        raise SimEventError(f"unknown field {unknown[0]!r} (accepted: {', '.join(FIELDS)})")
    kinds = [key for key in ("xid", "event", "mig", "compute-mode") if key in event]
    if len(kinds) != 1:
        raise SimEventError("needs exactly one of 'xid', 'event', 'mig' or 'compute-mode'")
    if event.get("event") == "wait-error":
        return event
    if "code" in event:
        raise SimEventError('\'code\' goes only with "event": "wait-error"')
    if "xid" in event:
        xid = event["xid"]
        if isinstance(xid, bool) or not isinstance(xid, int) or not 0 <= xid <= XID_MAX:
            raise SimEventError(f"xid: must be an integer from 0 to 2**64-1, got {xid!r}")
    return event
