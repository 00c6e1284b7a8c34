"""Reporting misfits (`nvdp.node.gpus.misfits`): the shell every command shares.

Each source (`resources`, `cdi`, `mps`, ...) hands the report the misfits it sees now; one that is new
is one WARNING line, one Warning Node event (its reason) where the API is reachable, and a count in
`nvdp_node_misfits_total{reason}`; one that went away is one INFO line. `/metrics` and `/readyz` read
the current set: a resource the config asks for that a misfit leaves without any device (`withholds`)
makes the daemon not ready, with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Protocol

from nvdp.base.logs import log_event
from nvdp.node.gpus.misfits import Misfit

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where Node events go (`nvdp.node.health.node_events.NodeEventRecorder`); never blocks."""

    def record(self, event_type: str, reason: str, message: str) -> None: ...


class MisfitReport:
    """The misfits each source sees now, reported once each. Thread-safe: sources update it from their
    loops, metrics and probes read it from theirs."""

    def __init__(self, events: EventSink | None = None) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._by_source: dict[str, tuple[Misfit, ...]] = {}
        self._seen: dict[str, int] = {}  # reason -> misfits of that reason reported so far

    def update(self, source: str, misfits: Iterable[Misfit]) -> None:
        """`source` sees exactly `misfits` now: report the new ones, note the ones that went away."""
        now = tuple(dict.fromkeys(misfits))  # in order, without repeats
        with self._lock:
            before = self._by_source.get(source, ())
            self._by_source[source] = now
            new = [m for m in now if m not in before]
            for misfit in new:
                self._seen[misfit.reason] = self._seen.get(misfit.reason, 0) + 1
        gone = [m for m in before if m not in now]
        for misfit in new:
            log_event(log, logging.WARNING, misfit.message, reason=misfit.reason)
            if self._events is not None:
                self._events.record("Warning", misfit.reason, misfit.message)
        for misfit in gone:
            log_event(log, logging.INFO, "resolved", reason=misfit.reason, subject=misfit.subject)

    def current(self) -> list[Misfit]:
        """Every misfit seen now, by source in the order they were first reported."""
        with self._lock:
            return [m for misfits in self._by_source.values() for m in misfits]

    def withheld(self) -> dict[str, str]:
        """Resource -> why the config's resource has no device on this node now."""
        out: dict[str, str] = {}
        for misfit in self.current():
            for resource in misfit.withholds:
                out.setdefault(resource, misfit.message)
        return out

    def seen(self) -> Mapping[str, int]:
        """Reason -> how many misfits of that reason were reported since start."""
        with self._lock:
            return dict(self._seen)
