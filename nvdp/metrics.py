"""Prometheus metrics and the daemon's HTTP endpoint: /metrics, /healthz, /readyz.

The exposition is our own (`nvdp.promtext`) and the HTTP server a few lines on `socketserver`: this
imports neither prometheus_client nor ssl, http.client or email, which would cost the plugin process
megabytes of RSS. `nvdp.daemon` imports this module only when metrics are on (--metrics-address not
empty), so a daemon without metrics does not pay even for that.

`Metrics` is the supervisor's StatusObserver. Events (RPCs, registrations, reloads, NVML errors) are
counted as they happen; state (device health, device counts, open streams, health events) is read from
the servers and the health monitor at scrape time, so the hot path does nothing for it. Label sets are
bounded: resource, device id, RPC method and status code, NVML call, XID; never pod names.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import ParamSpec, Protocol, TypeVar

import grpc

from nvdp import __version__
from nvdp.errors import NvdpError, NvmlError, NvmlNotSupported
from nvdp.health import HealthChange, MonitorStatus
from nvdp.logs import log_event
from nvdp.nvml.types import EventSet, EventType, GpuInfo, GpuLink, Nvml, NvmlEvent, ProbeResult
from nvdp.plugin.server import DevicePluginServer
from nvdp.promtext import (
    CONTENT_TYPE,
    Counter,
    CounterChild,
    Gauge,
    Histogram,
    HistogramChild,
    MetricFamily,
    Registry,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Allocate answers in well under a millisecond; a slow GetPreferredAllocation on a big node in tens.
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0)
_OK = grpc.StatusCode.OK
SOCKET_GRACE_S = 30.0  # a plugin socket may be missing this long while the supervisor restarts it


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

    __slots__ = ("by_code", "duration_error", "duration_ok", "ok")

    def __init__(self, metrics: Metrics, resource: str, method: str) -> None:
        self.duration_ok: HistogramChild = metrics._durations.labels(resource, method, "ok")
        self.duration_error: HistogramChild = metrics._durations.labels(resource, method, "error")
        self.ok: CounterChild = metrics._requests.labels(resource, method, "OK")
        self.by_code: dict[grpc.StatusCode, CounterChild] = {}


class Metrics:
    """Counts what the daemon does and serves it over HTTP. Thread-safe; one per daemon."""

    def __init__(self, address: str, *, version: str = __version__) -> None:
        self.address = address
        self.registry = Registry()
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
        self._requests = r.register(
            Counter(
                "nvdp_grpc_requests_total",
                "Device-plugin RPCs answered, by status code.",
                ["resource", "method", "code"],
            )
        )
        self._durations = r.register(
            Histogram(
                "nvdp_grpc_request_duration_seconds",
                "Device-plugin RPC latency, by result (ok: status OK; error: any other status).",
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
        r.register(_StateCollector(self))

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

    def collect(self) -> list[MetricFamily]:
        servers = self._metrics.servers()
        health = self._metrics.health
        unhealthy = health.unhealthy() if health is not None else {}
        status = health.monitor_status() if health is not None else None

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

        events = MetricFamily(
            "nvdp_health_events_total", "XID events seen by the health monitor.", "counter", ["xid"]
        )
        for xid, count in sorted((status.events_by_xid if status else {}).items()):
            events.add([str(xid)], count)
        degraded = MetricFamily(
            "nvdp_health_monitor_degraded", "1 while the health monitor cannot watch NVML events.", "gauge"
        )
        degraded.add([], 1.0 if status is not None and status.degraded else 0.0)
        return [device_healthy, devices, streams, events, degraded]


# ---- HTTP: one request per connection, GET and HEAD only -------------------------------------------

_TEXT = "text/plain; charset=utf-8"
_MAX_LINE = 8192  # request line or header line
_MAX_HEADERS = 100
_LINGER_S = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class _Handler(socketserver.StreamRequestHandler):
    server: _HttpServer
    timeout = 10.0  # a stuck client cannot hold a thread for long

    def handle(self) -> None:
        request_line = self.rfile.readline(_MAX_LINE + 1)
        if not request_line:
            return  # connected and closed (a TCP probe)
        parts = request_line.decode("latin-1").split()
        if len(request_line) > _MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._refuse(400, b"bad request\n")
        method, target, _ = parts
        for _ in range(_MAX_HEADERS):  # the headers change nothing here: read past them
            if self.rfile.readline(_MAX_LINE + 1) in (b"\r\n", b"\n", b""):
                break
        else:
            return self._refuse(431, b"too many headers\n")
        if method not in ("GET", "HEAD"):
            return self._refuse(405, b"method not allowed: use GET or HEAD\n", "Allow: GET, HEAD\r\n")
        head = method == "HEAD"
        path = target.partition("?")[0]
        metrics = self.server.metrics
        if path == "/metrics":
            self._reply(200, metrics.registry.render(), CONTENT_TYPE, head=head)
        elif path in ("/healthz", "/readyz"):
            problem = metrics.liveness_problem() if path == "/healthz" else metrics.readiness_problem()
            self._reply(200 if problem is None else 503, f"{problem or 'ok'}\n".encode(), head=head)
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", head=head)

    def _reply(
        self, code: int, body: bytes, content_type: str = _TEXT, *, head: bool = False, extra: str = ""
    ) -> None:
        header = (
            f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
        )
        self.wfile.write(header.encode() if head else header.encode() + body)

    def _refuse(self, code: int, body: bytes, extra: str = "") -> None:
        """Reply to a request not read to its end (a body, an overlong line), then read on until the
        client closes (at most _LINGER_S): closing with its bytes unread would reset the connection,
        and the client could lose the reply."""
        self._reply(code, body, extra=extra)
        self.connection.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _LINGER_S
        self.connection.settimeout(_LINGER_S)
        while time.monotonic() < deadline and self.connection.recv(65536):
            pass


class _HttpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted daemon binds despite connections in TIME_WAIT

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
