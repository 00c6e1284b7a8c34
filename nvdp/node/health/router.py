"""Routes the monitor's health changes to every plugin server, with one log line per transition.

- A change to a GPU or MIG uuid reaches every device of every target with that `Device.uuid` (all
  replicas); each target gets at most one `set_health` per direction per batch.
- Unhealthy uuids are remembered, so targets made on a reload start Unhealthy, until `forget`.
- Each transition is reported (log line, Node event) exactly once: one no target holds yet waits,
  in order, for the next `set_targets`; if still no target holds it then, it is dropped.
- With the ledger (`allocations`), lines and events name the holding pods (`pods=`, DRA's `claims=`,
  as last read, never waiting), each pod gets its own event (`pod_events`), and the ledger rereads.
- Node events are bounded per device (`nvdp.node.health.event_budget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nvdp.base.logs import format_fields, log_event
from nvdp.base.units import format_go_duration
from nvdp.node.gpus.devices import Device
from nvdp.node.health.event_budget import EventBudget
from nvdp.node.health.types import HealthChange, HealthTarget

if TYPE_CHECKING:
    from nvdp.plugins.ledger.types import Holding

log = logging.getLogger(__name__)

UNHEALTHY_EVENT_REASON = "GPUUnhealthy"
HEALTHY_EVENT_REASON = "GPUHealthy"
MAX_UNREPORTED = 1024  # changes held for targets yet to come; beyond it the oldest are dropped


class NodeEventSink(Protocol):
    """Where Kubernetes Node events go (`NodeEventRecorder`); must never block."""

    def record(self, event_type: str, reason: str, message: str) -> None: ...


class AllocationLookup(Protocol):
    """Who holds which devices (`nvdp.plugins.ledger.ledger.AllocationLedger`)."""

    def held(self, resource: str, device_ids: Collection[str]) -> list[Holding]:
        """The holdings of these devices, from memory (never waits)."""
        ...

    def changed(self) -> None:
        """A device changed health: read the record again soon (never waits)."""
        ...


class PodEventSink(Protocol):
    """Where the events of the pods a transition hits go (`nvdp.node.health.pod_events.PodEventRecorder`);
    must never block."""

    def record(
        self,
        resource: str,
        devices: Sequence[Device],
        change: HealthChange,
        before: HealthChange | None,
        holders: Sequence[Holding],
    ) -> None: ...


class HealthRouter:
    """The monitor's listener. Thread-safe: `set_targets` runs on reloads, `handle` on the monitor."""

    def __init__(
        self,
        targets: Iterable[HealthTarget] = (),
        *,
        node_events: NodeEventSink | None = None,
        allocations: AllocationLookup | None = None,
        pod_events: PodEventSink | None = None,
        event_budget: EventBudget | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._targets: list[HealthTarget] = list(targets)
        self._unhealthy: dict[str, HealthChange] = {}
        self._unreported: list[tuple[HealthChange, HealthChange | None]] = []  # (change, before)
        self._node_events = node_events
        self._allocations = allocations
        self._pod_events = pod_events
        self._budget = event_budget or EventBudget()

    def __call__(self, changes: Sequence[HealthChange]) -> None:
        self.handle(changes)

    def unhealthy(self) -> dict[str, HealthChange]:
        """uuid -> the change that made it Unhealthy."""
        with self._lock:
            return dict(self._unhealthy)

    def set_targets(self, targets: Iterable[HealthTarget]) -> None:
        """Replace the targets (config reload) and mark known-Unhealthy devices in the new ones.
        Changes no target held so far are reported now, where a new target holds their uuid."""
        with self._lock:
            self._targets = list(targets)
            reported = self._report_held()
            for target in self._targets:
                ids = [
                    d.id
                    for uuid in self._unhealthy
                    if uuid not in reported
                    for d in target.devices.with_uuid(uuid)
                ]
                if ids:
                    target.set_health(ids, False)
                    log_event(
                        log,
                        logging.INFO,
                        "kept devices unhealthy across reload",
                        resource=target.resource_name,
                        devices=len(ids),
                    )

    def forget(self, uuids: Iterable[str]) -> None:
        """Devices gone from the node's enumeration (hot-unplug, driver rebind, a MIG device
        destroyed): drop their Unhealthy state and held changes, so one that comes back (a new
        device, maybe with the same uuid) starts Healthy. The health monitor marks it again if it
        still fails."""
        gone = set(uuids)
        with self._lock:
            forgotten = sorted(gone & self._unhealthy.keys())
            for uuid in forgotten:
                del self._unhealthy[uuid]
            self._unreported = [(c, b) for c, b in self._unreported if c.uuid not in gone]
        if forgotten:
            log_event(
                log,
                logging.INFO,
                "forgot the health of devices gone from the node",
                devices=",".join(forgotten),
            )

    def _report_held(self) -> set[str]:
        """Report the held changes whose uuid a target holds now, in arrival order; drop the others.
        Returns the uuids reported."""
        held, self._unreported = self._unreported, []
        reported: set[str] = set()
        for change, before in held:
            matched = [(t, t.devices.with_uuid(change.uuid)) for t in self._targets]
            matched = [(t, devices) for t, devices in matched if devices]
            if not matched:
                continue  # a device no plugin serves (e.g. MIG devices under strategy none)
            reported.add(change.uuid)
            for target, devices in matched:
                self._report(target.resource_name, devices, change, before)
        for target in self._targets:  # the devices follow the state the changes left
            for healthy in (False, True):
                ids = [
                    d.id
                    for uuid in reported
                    if (uuid not in self._unhealthy) is healthy
                    for d in target.devices.with_uuid(uuid)
                ]
                if ids:
                    target.set_health(ids, healthy)
        return reported

    def handle(self, changes: Sequence[HealthChange]) -> None:
        with self._lock:
            updates: dict[int, dict[str, bool]] = {}  # target -> device id -> healthy (last wins)
            for change in changes:
                before = self._unhealthy.get(change.uuid)
                if change.healthy == (before is None):
                    continue  # no transition
                if change.healthy:
                    del self._unhealthy[change.uuid]
                else:
                    self._unhealthy[change.uuid] = change
                held = change.uuid in self._held_uuids()
                matched = False
                for n, target in enumerate(self._targets):
                    devices = target.devices.with_uuid(change.uuid)
                    if devices and not held:
                        matched = True
                        updates.setdefault(n, {}).update((d.id, change.healthy) for d in devices)
                        self._report(target.resource_name, devices, change, before)
                if not matched:
                    self._hold(change, before)
            for n, health in updates.items():
                for healthy in (False, True):
                    ids = [i for i, h in health.items() if h is healthy]
                    if ids:
                        self._targets[n].set_health(ids, healthy)

    def _held_uuids(self) -> set[str]:
        return {change.uuid for change, _ in self._unreported}

    def _hold(self, change: HealthChange, before: HealthChange | None) -> None:
        """Keep a change no target holds yet, to report it when one does."""
        self._unreported.append((change, before))
        if len(self._unreported) > MAX_UNREPORTED:
            dropped, _ = self._unreported.pop(0)
            log_event(
                log,
                logging.DEBUG,
                "health change dropped unreported: no plugin serves the device",
                device=dropped.uuid,
                healthy=dropped.healthy,
            )

    def _report(
        self, resource: str, devices: Sequence[Device], change: HealthChange, before: HealthChange | None
    ) -> None:
        fields: dict[str, Any] = {"resource": resource, "device": change.uuid, "index": devices[0].index}
        if change.healthy:
            message, level, kind, reason = "device healthy", logging.INFO, "Normal", HEALTHY_EVENT_REASON
            fields["after"] = format_go_duration(round(change.since - before.since, 3)) if before else None
        else:
            message, level, kind, reason = (
                "device unhealthy",
                logging.WARNING,
                "Warning",
                UNHEALTHY_EVENT_REASON,
            )
            fields.update(xid=change.xid, reason=change.reason, fatal=change.fatal)
        holders = self._allocations.held(resource, [d.id for d in devices]) if self._allocations else []
        if holders:
            fields["claims"] = ",".join(dict.fromkeys(h.claim for h in holders if h.claim)) or None
            fields["pods"] = ",".join(dict.fromkeys(h.pod_key for h in holders))
        log_event(log, level, message, **fields)
        if self._node_events is not None and self._budget.allow(
            ("node", resource, change.uuid), f"node events of {resource} device {change.uuid}"
        ):
            self._node_events.record(kind, reason, f"{message} {format_fields(fields)}")
        if self._pod_events is not None and holders:
            self._pod_events.record(resource, devices, change, before, holders)
        if self._allocations is not None:
            self._allocations.changed()
