"""The metric families and the supervisor's StatusObserver that feeds them.

Events (RPCs, registrations, reloads, NVML errors) are counted as they happen; state (device health,
device counts, open streams, health events, the monitor's degradation) is read at scrape time from the
supervisor's servers and the node's health, so the hot path does nothing for it. Label sets are
bounded: resource, device id, RPC method and status code, NVML call, XID; never pod names.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from nvdp import __version__
from nvdp.base.promtext import Counter, CounterChild, Gauge, Histogram, HistogramChild, MetricFamily, Registry
from nvdp.node.nvml.types import Nvml
from nvdp.plugins.metrics.nvml_errors import CountingNvml
from nvdp.plugins.metrics.sources import HealthView, MisfitView, RegistrationState

# Allocate answers in well under a millisecond; a slow GetPreferredAllocation on a big node in tens.
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0)
_OK = grpc.StatusCode.OK


class _Rpc:
    """Pre-resolved children of one (resource, method): rpc_done is a dict lookup and two increments."""

    __slots__ = ("by_code", "duration_error", "duration_ok", "ok")

    def __init__(self, families: MetricFamilies, resource: str, method: str) -> None:
        self.duration_ok: HistogramChild = families.durations.labels(resource, method, "ok")
        self.duration_error: HistogramChild = families.durations.labels(resource, method, "error")
        self.ok: CounterChild = families.requests.labels(resource, method, "OK")
        self.by_code: dict[grpc.StatusCode, CounterChild] = {}


class MetricFamilies:
    """nvdp's counted metric families in one registry, and the StatusObserver that counts into them.
    Thread-safe. Built before what it counts (the supervisor, the NVML wrapper); the state read at
    scrape time is a `StateCollector` registered beside them once its sources exist."""

    def __init__(self, version: str = __version__) -> None:
        self.registry = Registry()
        self._rpcs: dict[tuple[str, str], _Rpc] = {}

        r = self.registry
        self.requests = r.register(
            Counter(
                "nvdp_grpc_requests_total",
                "RPCs answered to the kubelet (device plugin; DRA: resource gpu.nvidia.com), by status code.",
                ["resource", "method", "code"],
            )
        )
        self.durations = r.register(
            Histogram(
                "nvdp_grpc_request_duration_seconds",
                "RPC latency (device plugin; DRA: resource gpu.nvidia.com), by result (ok: status OK;"
                " error: any other status).",
                ["resource", "method", "result"],
                buckets=RPC_BUCKETS,
            )
        )
        self._registrations = r.register(
            Counter(
                "nvdp_kubelet_registrations_total", "Registrations with the kubelet.", ["resource", "kind"]
            )
        )
        self._reloads = r.register(
            Counter("nvdp_config_reloads_total", "Configuration reloads (SIGHUP).", ["result"])
        )
        self._nvml_errors = r.register(
            Counter("nvdp_nvml_errors_total", "NVML calls that failed (NOT_SUPPORTED excluded).", ["call"])
        )
        for result in ("success", "failure"):
            self._reloads.labels(result)
        build = r.register(Gauge("nvdp_build_info", "Build information; the value is 1.", ["version"]))
        build.labels(version).set(1)

    # ---- StatusObserver (supervisor and server threads) ---------------------------------------
    def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        rpc = self._rpcs.get((resource, method))
        if rpc is None:
            rpc = self._rpcs.setdefault((resource, method), _Rpc(self, resource, method))
        if code is _OK:  # skips hashing the enum (a Python-level __hash__) on the common path
            rpc.duration_ok.observe(seconds)
            rpc.ok.inc()
            return
        rpc.duration_error.observe(seconds)
        counter = rpc.by_code.get(code)
        if counter is None:
            counter = rpc.by_code.setdefault(code, self.requests.labels(resource, method, code.name))
        counter.inc()

    def registered(self, resource: str, first: bool) -> None:
        self._registrations.labels(resource, "first" if first else "re-registration").inc()

    def servers_changed(self, servers: Mapping[str, object]) -> None:
        for name in servers:
            for kind in ("first", "re-registration"):
                self._registrations.labels(name, kind)

    def kubelet_lost(self) -> None:
        """Nothing to count: readiness reads the registrations from the supervisor."""

    def reloaded(self, ok: bool) -> None:
        self._reloads.labels("success" if ok else "failure").inc()

    def count_nvml_errors(self, nvml: Nvml) -> Nvml:
        """`nvml` with every failed call counted in nvdp_nvml_errors_total{call}."""
        return CountingNvml(nvml, lambda call: self._nvml_errors.labels(call).inc())


class StateCollector:
    """Metrics read at scrape time from the servers (the supervisor's), the node's health and misfits
    (each None: none to read)."""

    def __init__(
        self, registrations: RegistrationState | None, health: HealthView | None, misfits: MisfitView | None
    ) -> None:
        self._registrations, self._health, self._misfit_view = registrations, health, misfits

    def collect(self) -> list[MetricFamily]:
        source = self._registrations
        servers = dict(source.servers) if source is not None else {}
        health = self._health
        unhealthy = health.unhealthy() if health is not None else {}

        device_healthy = MetricFamily(
            "nvdp_device_healthy",
            "1 when the device is advertised Healthy, 0 when Unhealthy (with why).",
            "gauge",
            ["resource", "device", "reason"],
        )
        devices = MetricFamily(
            "nvdp_devices", "Devices advertised per resource.", "gauge", ["resource", "sharing"]
        )
        streams = MetricFamily(
            "nvdp_listandwatch_streams", "Open ListAndWatch streams.", "gauge", ["resource"]
        )
        for name, server in sorted(servers.items()):
            resource = server.resource
            devices.add([name, resource.sharing or "none"], len(resource.devices))
            streams.add([name], server.open_streams)
            for device_id, ok in server.health().items():
                reason = ""
                if not ok:
                    change = unhealthy.get(resource.devices[device_id].uuid)
                    reason = change.reason if change is not None else "unknown"
                device_healthy.add([name, device_id, reason], 1.0 if ok else 0.0)
        families = [device_healthy, devices, streams, *health_monitor_families(health)]
        return [*families, *misfit_families(self._misfit_view)]


def health_monitor_families(health: HealthView | None) -> list[MetricFamily]:
    """The health monitor's families (the device plugin's and the DRA plugin's): XID events seen, and
    whether it is degraded (cannot watch NVML events)."""
    status = health.monitor_status() if health is not None else None
    events = MetricFamily(
        "nvdp_health_events_total", "XID events seen by the health monitor.", "counter", ["xid"]
    )
    for xid, count in sorted((status.events_by_xid if status else {}).items()):
        events.add([str(xid)], count)
    degraded = MetricFamily(
        "nvdp_health_monitor_degraded", "1 while the health monitor cannot watch NVML events.", "gauge"
    )
    degraded.add([], 1.0 if status is not None and status.degraded else 0.0)
    return [events, degraded]


def misfit_families(view: MisfitView | None) -> list[MetricFamily]:
    """nvdp_node_misfits{reason} (seen now) and nvdp_node_misfits_total{reason} (reported since start)."""
    now = MetricFamily(
        "nvdp_node_misfits",
        "Node facts that keep part of the config from applying on this node now, by reason.",
        "gauge",
        ["reason"],
    )
    seen = MetricFamily(
        "nvdp_node_misfits_total",
        "Node facts that kept part of the config from applying, reported since start, by reason.",
        "counter",
        ["reason"],
    )
    if view is None:
        return [now, seen]
    current: dict[str, int] = {}
    for misfit in view.current():
        current[misfit.reason] = current.get(misfit.reason, 0) + 1
    counts = view.seen()
    for reason in sorted(counts):
        now.add([reason], current.get(reason, 0))
        seen.add([reason], counts[reason])
    return [now, seen]
