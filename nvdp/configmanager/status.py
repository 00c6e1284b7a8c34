"""`/metrics`, `/healthz` and `/readyz` of `nvdp config-manager` (`--metrics-address`, off by default).

/readyz answers 503 while no config has been applied yet, while the config the node should have
could not be put in place (it is retried with backoff), or while the Node watch has been failing or
silent for longer than the alarm time (the config is then not following the label): the readiness
signal beside the ERROR log line. The metrics are a handful of gauges and counters, written out by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nvdp.http_endpoint import HttpEndpoint


@dataclass(frozen=True)
class Snapshot:
    applied: bool  # a config is in place
    applied_total: int
    refused_total: int
    signals_total: int
    watch_failing_for: float  # seconds; 0 when the watch is fine
    retrying: str | None = None  # why the selected config is not in place (being retried)


def render(s: Snapshot, alarm_after: float) -> bytes:
    failing = s.watch_failing_for
    lines = [
        "# HELP nvdp_config_manager_config_applied 1 when a config file is in place for the plugin.",
        "# TYPE nvdp_config_manager_config_applied gauge",
        f"nvdp_config_manager_config_applied {int(s.applied)}",
        "# HELP nvdp_config_manager_applied_total Config changes applied (link swapped or content changed).",
        "# TYPE nvdp_config_manager_applied_total counter",
        f"nvdp_config_manager_applied_total {s.applied_total}",
        "# HELP nvdp_config_manager_refused_total Selections refused (unknown label value, invalid entry).",
        "# TYPE nvdp_config_manager_refused_total counter",
        f"nvdp_config_manager_refused_total {s.refused_total}",
        "# HELP nvdp_config_manager_signals_total Signals sent to the plugin process.",
        "# TYPE nvdp_config_manager_signals_total counter",
        f"nvdp_config_manager_signals_total {s.signals_total}",
        "# HELP nvdp_config_manager_watch_failing_seconds Seconds the Node watch has been failing (0: fine).",
        "# TYPE nvdp_config_manager_watch_failing_seconds gauge",
        f"nvdp_config_manager_watch_failing_seconds {failing:.3f}",
        "# HELP nvdp_config_manager_watch_healthy 0 once the watch has failed for over the alarm time.",
        "# TYPE nvdp_config_manager_watch_healthy gauge",
        f"nvdp_config_manager_watch_healthy {int(failing < alarm_after)}",
        "# HELP nvdp_config_manager_apply_failing 1 while the selected config is not in place (retried).",
        "# TYPE nvdp_config_manager_apply_failing gauge",
        f"nvdp_config_manager_apply_failing {int(s.retrying is not None)}",
    ]
    return ("\n".join(lines) + "\n").encode()


def not_ready(s: Snapshot, alarm_after: float) -> str | None:
    if not s.applied:
        return "no config applied yet"
    if s.retrying is not None:
        return f"config not in place, retrying: {s.retrying}"
    if s.watch_failing_for >= alarm_after:
        return f"node watch failing for {s.watch_failing_for:.0f}s"
    return None


class StatusServer:
    """Serves the snapshot `read()` returns on nvdp's HTTP endpoint (the plugin's, with its bounds on
    slow clients). `start()` binds (NvdpError when it cannot); `stop()` is idempotent."""

    def __init__(self, address: str, read: Callable[[], Snapshot], alarm_after: float) -> None:
        self._read = read
        self._alarm_after = alarm_after
        self._endpoint = HttpEndpoint(address, self)

    @property
    def port(self) -> int:
        return self._endpoint.port

    def start(self) -> StatusServer:
        self._endpoint.start()
        return self

    def stop(self) -> None:
        self._endpoint.stop()

    # ---- Pages ----------------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        return render(self._read(), self._alarm_after)

    def liveness_problem(self) -> str | None:
        return None

    def readiness_problem(self) -> str | None:
        return not_ready(self._read(), self._alarm_after)


def failing_for(since: float | None) -> float:
    return 0.0 if since is None else time.monotonic() - since
