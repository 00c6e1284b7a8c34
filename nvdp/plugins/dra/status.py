"""The DRA kubelet plugin's HTTP endpoint (`--metrics-address`, the device plugin's flag and default):
/metrics, /healthz and /readyz on `nvdp.base.http_endpoint` in nvdp's exposition (`nvdp.base.promtext`).

- /metrics: the device plugin's families (`MetricFamilies`, here resource `gpu.nvidia.com` and
  methods Node(Un)PrepareResources), its health and misfit families, and the DRA plugin's own:
  claims by outcome, and at scrape time devices by type, health, prepared claims, slice writes and
  failed publishes. Labels are bounded by the node's devices.
- /healthz: the main loop returns to waiting in good time (`LoopWatch`); NVML failing at start is
  no liveness failure (retried; /readyz says it).
- /readyz: NVML started, registered, both sockets served, slices published once, their watch not
  failing past its alarm time, health monitor running; else every reason, one line each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from nvdp.base.errors import NvdpError
from nvdp.base.http_endpoint import ServedPages
from nvdp.base.promtext import Counter, MetricFamily
from nvdp.plugins.dra.names import DRIVER_NAME, GPU_TYPE, MIG_TYPE
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.prepare import ClaimPreparer
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.plugins.kubeletplugin.loop_watch import LoopWatch
from nvdp.plugins.kubeletplugin.registration import RegistrationService
from nvdp.plugins.kubeletplugin.socket_server import UnixSocketServer
from nvdp.plugins.metrics.families import MetricFamilies, health_monitor_families, misfit_families
from nvdp.plugins.metrics.readiness import monitor_problem
from nvdp.plugins.metrics.sources import HealthView, MisfitView

METHODS = ("NodePrepareResources", "NodeUnprepareResources")
T = TypeVar("T")


class DraSources(Protocol):
    """What the pages read of the driver's parts (`nvdp.plugins.dra.loop.DraLoop`), at request time."""

    @property
    def loop_watch(self) -> LoopWatch: ...
    @property
    def registration(self) -> RegistrationService: ...
    @property
    def publisher(self) -> SlicePublisher: ...
    @property
    def state(self) -> NodeState: ...
    @property
    def health(self) -> HealthView: ...
    @property
    def misfits(self) -> MisfitView: ...
    @property
    def preparer(self) -> ClaimPreparer | None:
        """None until the driver has started (NVML initialised)."""
        ...

    @property
    def nvml_failure(self) -> str | None:
        """Why NVML cannot be initialised now (retried), while it cannot."""
        ...

    @property
    def sockets(self) -> Sequence[UnixSocketServer]:
        """The servers of the DRA socket and the registration socket."""
        ...


class DraCounters:
    """The counted families: the device plugin's (`families`), fed as the DRA plugin's events come
    (the server's `RequestObserver`, the registration's, reloads), and claims by outcome."""

    def __init__(self) -> None:
        self.families = MetricFamilies()
        self._claims = self.families.registry.register(
            Counter(
                "nvdp_dra_claims_total",
                "Claims answered by NodePrepareResources / NodeUnprepareResources, by result (error: the"
                " claim's answer carries an error).",
                ["method", "result"],
            )
        )
        for method in METHODS:
            for result in ("ok", "error"):
                self._claims.labels(method, result)

    def request_done(self, method: str, code: grpc.StatusCode, seconds: float, errors: Sequence[str]) -> None:
        self.families.rpc_done(DRIVER_NAME, method, code, seconds)
        failed = sum(1 for error in errors if error)
        if failed:
            self._claims.labels(method, "error").inc(failed)
        if len(errors) > failed:
            self._claims.labels(method, "ok").inc(len(errors) - failed)

    def registered(self, first: bool) -> None:
        self.families.registered(DRIVER_NAME, first)

    def counted_reload(self, reload: Callable[[], T]) -> Callable[[], T]:
        """`reload` with each call counted in nvdp_config_reloads_total{result} (failure: NvdpError)."""

        def counted() -> T:
            try:
                settings = reload()
            except NvdpError:
                self.families.reloaded(False)
                raise
            self.families.reloaded(True)
            return settings

        return counted


class DraStatus(ServedPages):
    """/metrics, /healthz and /readyz on `address`: the `counters` (fed since the start) and what the
    built parts (`sources`) say at request time."""

    def __init__(self, address: str, counters: DraCounters, sources: DraSources) -> None:
        self.counters = counters
        self.sources = sources
        self.registry = self.counters.families.registry
        self.registry.register(_DraState(sources))
        super().__init__(address, self)

    # ---- Pages ----------------------------------------------------------------------------------
    def render_metrics(self, peer: str) -> bytes:
        return self.registry.render()

    def liveness_problem(self) -> str | None:
        return self.sources.loop_watch.problem()

    def readiness_problem(self) -> str | None:
        """Every reason the plugin is not ready, one line each; None when ready."""
        s = self.sources
        problems = []
        if s.preparer is None:
            failure = s.nvml_failure
            problems.append(f"NVML not initialised, retrying: {failure}" if failure else "starting")
        registration = s.registration.problem()
        if registration is not None:
            problems.append(registration)
        problems += [f"socket not served: {path}" for server in s.sockets for path in server.unserved()]
        if not s.publisher.published.is_set():
            failing = s.publisher.failing
            problems.append("ResourceSlices not published yet" + (f": {failing}" if failing else ""))
        watch = s.publisher.watch_problem()
        if watch is not None:
            problems.append(watch)
        monitor = monitor_problem(s.health) if s.preparer is not None else None
        if monitor is not None:
            problems.append(monitor)
        return "\n".join(problems) or None

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        return None


class _DraState:
    """The families read at scrape time from the driver's parts."""

    def __init__(self, sources: DraSources) -> None:
        self._sources = sources

    def collect(self) -> list[MetricFamily]:
        s = self._sources
        devices = MetricFamily(
            "nvdp_dra_devices", "Devices this node's ResourceSlices say, by type.", "gauge", ["type"]
        )
        said = s.publisher.devices_by_type()
        for kind in sorted({GPU_TYPE, MIG_TYPE, *said}):
            devices.add([kind], said.get(kind, 0))
        healthy = MetricFamily(
            "nvdp_dra_device_healthy",
            "1 when a device DRA serves is Healthy, 0 when Unhealthy (with why): tainted or withdrawn"
            " in the slice, refused to new claims.",
            "gauge",
            ["device", "type", "reason"],
        )
        kinds = {d.name: str(d.attributes.get("type", {}).get("string", "")) for d in s.state.devices()}
        for device in sorted(s.state.health(), key=lambda h: h.device):
            reason = "" if device.healthy else device.message or "unknown"
            healthy.add([device.device, kinds.get(device.device, ""), reason], 1.0 if device.healthy else 0.0)
        prepared = MetricFamily(
            "nvdp_dra_prepared_claims", "Claims prepared on this node (in the checkpoint).", "gauge"
        )
        preparer = s.preparer
        prepared.add([], len(preparer.prepared) if preparer is not None else 0)
        writes = MetricFamily(
            "nvdp_dra_slice_writes_total", "ResourceSlice writes: creates, updates, deletes.", "counter"
        )
        writes.add([], s.publisher.writes)
        failures = MetricFamily(
            "nvdp_dra_slice_publish_failures_total",
            "Publishes of the ResourceSlices that failed (each retried with backoff).",
            "counter",
        )
        failures.add([], s.publisher.failures)
        state = [devices, healthy, prepared, writes, failures]
        return [*state, *health_monitor_families(s.health), *misfit_families(s.misfits)]
