"""Prometheus metrics and the daemon's HTTP endpoint: /metrics, /healthz, /readyz.

The only importer of prometheus_client; `nvdp.daemon` imports this module only when metrics are on
(--metrics-address not empty), so a daemon without metrics does not pay for it.

`Metrics` is the supervisor's StatusObserver. Events (RPCs, registrations, reloads, NVML errors) are
counted as they happen; state (device health, device counts, open streams, health events) is read from
the servers and the health monitor at scrape time, so the hot path does nothing for it. Label sets are
bounded: resource, device id, RPC method and status code, NVML call, XID; never pod names.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ParamSpec, Protocol, TypeVar

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from nvdp import __version__
from nvdp.errors import NvdpError, NvmlError, NvmlNotSupported
from nvdp.health import HealthChange, MonitorStatus
from nvdp.logs import log_event
from nvdp.nvml.types import EventSet, EventType, GpuInfo, GpuLink, Nvml, NvmlEvent, ProbeResult
from nvdp.plugin.server import DevicePluginServer

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Allocate answers in well under a millisecond; a slow GetPreferredAllocation on a big node in tens.
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0)
_OK = grpc.StatusCode.OK
SOCKET_GRACE_S = 30.0  # a plugin socket may be missing this long while the supervisor restarts it

prometheus_client.disable_created_metrics()  # no `_created` twin series (process-wide; we are its only user)


class HealthView(Protocol):
    """The node's health as metrics and /readyz read it (`nvdp.daemon.NodeHealth`)."""

    @property
    def checks_enabled(self) -> bool: ...

    def monitor_status(self) -> MonitorStatus | None:
        """None until the monitor is created."""
        ...

    def unhealthy(self) -> Mapping[str, HealthChange]:
        """GPU/MIG uuid -> the change that made it Unhealthy."""
        ...


class _Rpc:
    """Pre-resolved children of one (resource, method): rpc_done is a dict lookup and two increments."""

    __slots__ = ("by_code", "duration", "ok")

    def __init__(self, metrics: Metrics, resource: str, method: str) -> None:
        self.duration: Histogram = metrics._durations.labels(resource, method)
        self.ok: Counter = metrics._requests.labels(resource, method, "OK")
        self.by_code: dict[grpc.StatusCode, Counter] = {}


class Metrics:
    """Counts what the daemon does and serves it over HTTP. Thread-safe; one per daemon."""

    def __init__(self, address: str, *, version: str = __version__) -> None:
        self.address = address
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._servers: Mapping[str, DevicePluginServer] | None = None  # None until the first apply
        self._registered: set[str] = set()
        self._missing_since: dict[int, float] = {}  # id(server) -> when its socket was seen missing
        self.health: HealthView | None = None  # set by the daemon once the node's health exists
        self._rpcs: dict[tuple[str, str], _Rpc] = {}
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

        r = self.registry
        self._requests = Counter(
            "nvdp_grpc_requests",
            "Device-plugin RPCs answered, by status code.",
            ["resource", "method", "code"],
            registry=r,
        )
        self._durations = Histogram(
            "nvdp_grpc_request_duration_seconds",
            "Device-plugin RPC latency.",
            ["resource", "method"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self._registrations = Counter(
            "nvdp_kubelet_registrations", "Registrations with the kubelet.", ["resource", "kind"], registry=r
        )
        self._reloads = Counter(
            "nvdp_config_reloads", "Configuration reloads (SIGHUP).", ["result"], registry=r
        )
        self._nvml_errors = Counter(
            "nvdp_nvml_errors", "NVML calls that failed (NOT_SUPPORTED excluded).", ["call"], registry=r
        )
        for result in ("success", "failure"):
            self._reloads.labels(result)
        build = Gauge("nvdp_build_info", "Build information; the value is 1.", ["version"], registry=r)
        build.labels(version).set(1)
        r.register(_StateCollector(self))

    # ---- StatusObserver (supervisor and server threads) ---------------------------------------
    def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        rpc = self._rpcs.get((resource, method))
        if rpc is None:
            rpc = self._rpcs.setdefault((resource, method), _Rpc(self, resource, method))
        rpc.duration.observe(seconds)
        if code is _OK:  # skips hashing the enum (a Python-level __hash__) on the common path
            rpc.ok.inc()
            return
        counter = rpc.by_code.get(code)
        if counter is None:
            counter = rpc.by_code.setdefault(code, self._requests.labels(resource, method, code.name))
        counter.inc()

    def registered(self, resource: str, first: bool) -> None:
        self._registrations.labels(resource, "first" if first else "re-registration").inc()
        with self._lock:
            self._registered.add(resource)

    def servers_changed(self, servers: Mapping[str, DevicePluginServer]) -> None:
        with self._lock:
            before = self._servers or {}
            # A replaced server (changed resource, restarted socket) must register again.
            self._registered = {n for n in self._registered if n in servers and servers[n] is before.get(n)}
            self._servers = dict(servers)
        for name in servers:
            for kind in ("first", "re-registration"):
                self._registrations.labels(name, kind)

    def kubelet_lost(self) -> None:
        with self._lock:
            self._registered.clear()

    def reloaded(self, ok: bool) -> None:
        self._reloads.labels("success" if ok else "failure").inc()

    # ---- inputs -------------------------------------------------------------------------------
    def count_nvml_errors(self, nvml: Nvml) -> Nvml:
        """`nvml` with every failed call counted in nvdp_nvml_errors_total{call}."""
        return _CountingNvml(nvml, self)

    def nvml_error(self, call: str) -> None:
        self._nvml_errors.labels(call).inc()

    # ---- probes -------------------------------------------------------------------------------
    def servers(self) -> Mapping[str, DevicePluginServer]:
        with self._lock:
            return self._servers or {}

    def liveness_problem(self) -> str | None:
        """None when every server serves on its socket or is being restarted (socket wiped by a kubelet
        restart less than SOCKET_GRACE_S ago, or the kubelet is away); else why not."""
        now = time.monotonic()
        stuck = []
        with self._lock:
            missing: dict[int, float] = {}
            for name, server in (self._servers or {}).items():
                if name in self._registered and not server.socket_is_ours():
                    since = missing[id(server)] = self._missing_since.get(id(server), now)
                    if now - since >= SOCKET_GRACE_S:
                        stuck.append(str(server.socket_path))
            self._missing_since = missing
        if not stuck:
            return None
        return f"plugin socket missing for over {SOCKET_GRACE_S:.0f}s: {', '.join(sorted(stuck))}"

    def readiness_problem(self) -> str | None:
        """None when every resource is registered with the running kubelet and the health monitor runs
        (or when there is nothing to serve: no devices, or NVML failed with fail-on-init-error=false)."""
        with self._lock:
            servers, registered = self._servers, set(self._registered)
        if servers is None:
            return "starting: no resources served yet"
        missing = sorted(set(servers) - registered)
        if missing:
            return f"not registered: {', '.join(missing)}"
        health = self.health
        if servers and health is not None and health.checks_enabled:  # no devices, nothing to watch
            status = health.monitor_status()
            if status is None or not status.running:
                return "health monitor not running"
        return None

    # ---- HTTP ---------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 before start."""
        return self._http.server_address[1] if self._http is not None else 0

    def start(self) -> None:
        """Bind --metrics-address and serve on a daemon thread. Raises NvdpError when it cannot bind."""
        if self._http is not None:
            return
        host, port = parse_address(self.address)
        try:
            http = _HttpServer(host, port, self)
        except OSError as error:
            raise NvdpError(f"cannot listen on metrics address {self.address!r}: {error}") from error
        self._closing.clear()
        self._http = http
        self._thread = threading.Thread(target=self._serve, args=(http,), name="nvdp-metrics", daemon=True)
        self._thread.start()
        log_event(
            log,
            logging.INFO,
            "serving metrics",
            address=f"{host or '*'}:{self.port}",
            paths="/metrics,/healthz,/readyz",
        )

    def _serve(self, http: _HttpServer) -> None:
        # handle_request blocks without a timeout (no idle wake-ups); stop() wakes it by shutting the
        # listening socket down.
        while not self._closing.is_set():
            http.handle_request()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        http, self._http = self._http, None
        thread, self._thread = self._thread, None
        if http is None:
            return
        self._closing.set()
        try:
            http.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if thread is not None:
            thread.join(2.0)
        http.server_close()


def parse_address(address: str) -> tuple[str, int]:
    """Split a listen address: "host:port", ":port" (every IPv4 interface) or "[v6]:port"."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class _StateCollector:
    """Metrics read at scrape time from the servers and the health monitor."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        servers = self._metrics.servers()
        health = self._metrics.health
        unhealthy = health.unhealthy() if health is not None else {}
        status = health.monitor_status() if health is not None else None

        device_healthy = GaugeMetricFamily(
            "nvdp_device_healthy",
            "1 when the device is advertised Healthy, 0 when Unhealthy (with why).",
            labels=["resource", "device", "reason"],
        )
        devices = GaugeMetricFamily(
            "nvdp_devices", "Devices advertised per resource.", labels=["resource", "sharing"]
        )
        streams = GaugeMetricFamily(
            "nvdp_listandwatch_streams", "Open ListAndWatch streams.", labels=["resource"]
        )
        for name, server in sorted(servers.items()):
            resource = server.resource
            devices.add_metric([name, resource.sharing or "none"], len(resource.devices))
            streams.add_metric([name], server.open_streams)
            for device_id, ok in server.health().items():
                reason = ""
                if not ok:
                    change = unhealthy.get(resource.devices[device_id].uuid)
                    reason = change.reason if change is not None else "unknown"
                device_healthy.add_metric([name, device_id, reason], 1.0 if ok else 0.0)

        events = CounterMetricFamily(
            "nvdp_health_events", "XID events seen by the health monitor.", labels=["xid"]
        )
        for xid, count in sorted((status.events_by_xid if status else {}).items()):
            events.add_metric([str(xid)], count)
        degraded = GaugeMetricFamily(
            "nvdp_health_monitor_degraded",
            "1 while the health monitor cannot watch NVML events.",
            value=1.0 if status is not None and status.degraded else 0.0,
        )
        return [device_healthy, devices, streams, events, degraded]


_TEXT = "text/plain; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    timeout = 10.0  # a stuck client cannot hold a thread for long

    def do_GET(self) -> None:
        metrics = self.server.metrics
        path = self.path.partition("?")[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(metrics.registry), content_type)
        elif path in ("/healthz", "/readyz"):
            problem = metrics.liveness_problem() if path == "/healthz" else metrics.readiness_problem()
            self._reply(200 if problem is None else 503, f"{problem or 'ok'}\n".encode(), _TEXT)
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", _TEXT)

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """No line per scrape or probe."""


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, metrics: Metrics) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.metrics = metrics
        super().__init__((host, port), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone mid-reply is not worth a traceback on stderr: one debug line."""
        log_event(
            log,
            logging.DEBUG,
            "metrics request failed",
            client=str(client_address),
            error=repr(sys.exc_info()[1]),
        )


class _CountingNvml:
    """An Nvml (and its event sets) that counts failed calls by NVML function, then re-raises."""

    def __init__(self, nvml: Nvml, metrics: Metrics) -> None:
        self._nvml = nvml
        self._metrics = metrics

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except NvmlNotSupported:
            raise  # a capability answer, not a failure
        except NvmlError as error:
            self._metrics.nvml_error(error.call)
            raise

    def init(self) -> None:
        self.call(self._nvml.init)

    def shutdown(self) -> None:
        self.call(self._nvml.shutdown)

    def driver_version(self) -> str:
        return self.call(self._nvml.driver_version)

    def cuda_driver_version(self) -> str:
        return self.call(self._nvml.cuda_driver_version)

    def gpus(self) -> list[GpuInfo]:
        return self.call(self._nvml.gpus)

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        return self.call(self._nvml.link, uuid_a, uuid_b)

    def create_event_set(self) -> EventSet:
        return _CountingEventSet(self.call(self._nvml.create_event_set), self)

    def probe(self, gpu_uuid: str) -> ProbeResult:
        return self.call(self._nvml.probe, gpu_uuid)


class _CountingEventSet:
    def __init__(self, event_set: EventSet, nvml: _CountingNvml) -> None:
        self._set = event_set
        self._nvml = nvml

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        return self._nvml.call(self._set.register, gpu_uuid, event_types)

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        return self._nvml.call(self._set.wait, timeout_ms)

    def close(self) -> None:
        self._nvml.call(self._set.close)
