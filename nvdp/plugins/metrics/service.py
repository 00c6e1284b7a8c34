"""The daemon's metrics, put together: the metric families, the state read at scrape time, the
probes and the allocation ledger's page, served by the HTTP endpoint. `nvdp.plugins.deviceplugin.daemon`
builds the families first (they count NVML calls and are the supervisor's StatusObserver), then one `Metrics`
once the supervisor, health and the ledger exist."""

from __future__ import annotations

from nvdp.base.http_endpoint import EndpointFactory, ServedPages
from nvdp.base.promtext import render
from nvdp.plugins.metrics.allocations import JSON_CONTENT_TYPE, AllocationPages
from nvdp.plugins.metrics.families import MetricFamilies, StateCollector
from nvdp.plugins.metrics.readiness import Probes


class Metrics(ServedPages):
    """/metrics, /healthz and /readyz on `address`: the counted `families`, the state read from the
    probes' sources (the supervisor, the node's health and misfits) and the `probes`; with
    `allocations`, /allocations and nvdp_device_allocated. Thread-safe; one per daemon."""

    def __init__(
        self,
        address: str,
        families: MetricFamilies | None = None,
        probes: Probes | None = None,
        *,
        allocations: AllocationPages | None = None,
        endpoint: EndpointFactory | None = None,
    ) -> None:
        self.families = families or MetricFamilies()
        self.probes = probes or Probes()
        self.registry = self.families.registry
        p = self.probes
        self.registry.register(StateCollector(p.registrations, p.health, p.misfits))
        self.allocations = allocations  # rendered per client: pod detail is the client's to see or not
        super().__init__(address, self, endpoint)

    # ---- Pages: what the endpoint serves -------------------------------------------------------
    def render_metrics(self, peer: str) -> bytes:
        allocated = render(self.allocations.collect(peer)) if self.allocations is not None else b""
        return self.registry.render() + allocated

    def liveness_problem(self) -> str | None:
        return self.probes.liveness_problem()

    def readiness_problem(self) -> str | None:
        return self.probes.readiness_problem()

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        if path == "/allocations" and self.allocations is not None:
            return JSON_CONTENT_TYPE, self.allocations.render(peer)
        return None
