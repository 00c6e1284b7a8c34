"""The hand-over's rule, pure: what one API's record says (`Record`) and what an API may serve given
it (`settle`); the protocol around it is `nvdp.plugins.handoff.records`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
API_WORDS = {DEVICE_PLUGIN: "the device plugin", DRA: "the DRA driver"}
UNKNOWN_HOLDER = "an unreadable hand-over record"


def device_plugin_record_dir(kubelet_socket: Path, driver: str) -> Path:
    """Where the device plugin finds the records: the DRA driver `driver`'s directory in the kubelet's
    plugins directory, beside the device plugins' (`<kubelet dir>/../plugins/<driver>`)."""
    return kubelet_socket.parent.parent / "plugins" / driver


@dataclass(frozen=True)
class Record:
    """What one API's record says; `alive` whether its process runs (holds the lock); `known` False
    when the record cannot be trusted (then the API may hold any GPU)."""

    serving: frozenset[str] = frozenset()
    holds: Mapping[str, str] = field(default_factory=dict)
    alive: bool = False
    known: bool = True
    units: Mapping[str, int] = field(default_factory=dict)

    def advertised(self) -> dict[str, int]:
        """The devices per resource name the API advertises now: its `units`, none while its process
        is not running."""
        return {name: count if self.alive else 0 for name, count in self.units.items()}


@dataclass(frozen=True)
class Settled:
    """What an API may serve now: `serve` (GPU uuids); `kept`: GPUs the config gives the other API
    that a pod holds here (uuid -> holder); `waiting`: GPUs the config gives this API that the other
    API still serves or holds (uuid -> holder, or "" while it only advertises it)."""

    serve: frozenset[str]
    kept: Mapping[str, str] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)


def settle(mine: frozenset[str], serving: frozenset[str], holds: Mapping[str, str], other: Record) -> Settled:
    """The rule (pure): `mine` are the GPUs the config gives this API, `serving` those it serves now,
    `holds` those its pods hold (uuid -> holder); `other` the other API's record."""
    kept = {u: holds[u] for u in sorted(serving - mine) if u in holds}
    waiting: dict[str, str] = {}
    for uuid in sorted(mine - serving):
        if not other.known:
            waiting[uuid] = UNKNOWN_HOLDER
        elif uuid in other.holds:
            waiting[uuid] = other.holds[uuid]
        elif other.alive and uuid in other.serving:
            waiting[uuid] = ""
    return Settled(frozenset((mine - waiting.keys()) | kept.keys()), kept, waiting)


def unit_count(value: object) -> int:
    """A record's device count: a whole number, not negative."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"units: {value!r} is no count of devices")
    return value
