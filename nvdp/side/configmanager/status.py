"""`/metrics`, `/healthz` and `/readyz` of `nvdp config-manager` (`--metrics-address`, off by default).

/readyz answers 503 while no config has been applied yet, while the config the node should have
could not be put in place (it is retried with backoff), or while the Node watch (or the ConfigMap
watch, with --configmap-name) has been failing or silent for longer than the alarm time (the config
is then not following the label, or ConfigMap edits wait for the mount): the readiness signal beside
the ERROR log line. The metrics are a handful of gauges and counters read from a snapshot
at scrape time, written out by the plugin's exposition writer (`nvdp.base.promtext`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nvdp.base import promtext
from nvdp.base.http_endpoint import ServedPages
from nvdp.base.promtext import MetricFamily, MetricType


@dataclass(frozen=True)
class Snapshot:
    applied: bool  # a config is in place
    applied_total: int
    refused_total: int
    signals_total: int
    watch_failing_for: float  # seconds; 0 when the watch is fine
    retrying: str | None = None  # why the selected config is not in place (being retried)
    configmap_watch_failing_for: float = 0.0  # seconds; 0 when fine or not watched
    watch_error: str = ""  # the Node watch's last failure, while it fails
    configmap_watch_error: str = ""  # the ConfigMap watch's


_FAMILIES: tuple[tuple[str, MetricType, str], ...] = (  # name (after nvdp_config_manager_), type, help
    ("config_applied", "gauge", "1 when a config file is in place for the plugin."),
    ("applied_total", "counter", "Config changes applied (link swapped or content changed)."),
    ("refused_total", "counter", "Selections refused (unknown label value, invalid entry)."),
    ("signals_total", "counter", "Signals sent to the plugin process."),
    ("watch_failing_seconds", "gauge", "Seconds the Node watch has been failing (0: fine)."),
    ("watch_healthy", "gauge", "0 once the watch has failed for over the alarm time."),
    ("apply_failing", "gauge", "1 while the selected config is not in place (retried)."),
    ("configmap_watch_failing_seconds", "gauge", "Seconds the ConfigMap watch has been failing (0: fine)."),
)


def render(s: Snapshot, alarm_after: float) -> bytes:
    """The exposition of a snapshot: one sample per family of _FAMILIES, in its order."""
    failing = s.watch_failing_for
    values: list[float] = [s.applied, s.applied_total, s.refused_total, s.signals_total, round(failing, 3)]
    values += [failing < alarm_after, s.retrying is not None, round(s.configmap_watch_failing_for, 3)]
    families = [MetricFamily(f"nvdp_config_manager_{name}", help, kind) for name, kind, help in _FAMILIES]
    for family, value in zip(families, values, strict=True):
        family.add((), value)
    return promtext.render(families)


def not_ready(s: Snapshot, alarm_after: float) -> str | None:
    if not s.applied:
        return "no config applied yet"
    if s.retrying is not None:
        return f"config not in place, retrying: {s.retrying}"
    if s.watch_failing_for >= alarm_after:
        return f"node watch failing for {s.watch_failing_for:.0f}s" + (
            f": {s.watch_error}" if s.watch_error else ""
        )
    if s.configmap_watch_failing_for >= alarm_after:
        why = f": {s.configmap_watch_error}" if s.configmap_watch_error else ""
        return f"configmap watch failing for {s.configmap_watch_failing_for:.0f}s{why}"
    return None


class StatusServer(ServedPages):
    """Serves the snapshot `read()` returns on nvdp's HTTP endpoint (the plugin's, with its bounds on
    slow clients), as the plugin's `Metrics` serve the daemon's."""

    def __init__(self, address: str, read: Callable[[], Snapshot], alarm_after: float) -> None:
        self._read = read
        self._alarm_after = alarm_after
        super().__init__(address, self)

    # ---- Pages ----------------------------------------------------------------------------------
    def render_metrics(self, peer: str) -> bytes:
        return render(self._read(), self._alarm_after)

    def liveness_problem(self) -> str | None:
        return None

    def readiness_problem(self) -> str | None:
        return not_ready(self._read(), self._alarm_after)

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        return None


def failing_for(since: float | None) -> float:
    return 0.0 if since is None else time.monotonic() - since
