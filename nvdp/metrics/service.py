"""The daemon's metrics, put together: the metric families (and their StatusObserver), the probes and
the HTTP endpoint, with the daemon's sources attached to them. `nvdp.daemon` holds one `Metrics`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import grpc

from nvdp import __version__
from nvdp.http_endpoint import HttpEndpoint, Pages
from nvdp.metrics.families import MetricFamilies
from nvdp.metrics.nvml_errors import CountingNvml
from nvdp.metrics.readiness import Probes
from nvdp.metrics.sources import HealthView, MisfitView, RegistrationState
from nvdp.nvml.types import Nvml


class Endpoint(Protocol):
    """Where the pages are served (`HttpEndpoint`)."""

    @property
    def port(self) -> int:
        """The bound port; 0 before start."""
        ...

    def start(self) -> None:
        """Bind and serve. Raises NvdpError when it cannot bind."""
        ...

    def stop(self) -> None:
        """Stop serving. Idempotent."""
        ...


EndpointFactory = Callable[[str, Pages], Endpoint]  # (listen address, pages) -> endpoint


class Metrics:
    """Counts what the daemon does and serves it. Thread-safe; one per daemon.

    The supervisor's StatusObserver. The daemon attaches `registrations` (the supervisor) and `health`
    (the node's health) once they exist; scrapes and probes read them then.
    """

    rpc_done: Callable[[str, str, grpc.StatusCode, float], None]  # the hot path: no extra call

    def __init__(
        self,
        address: str,
        *,
        version: str = __version__,
        endpoint: EndpointFactory = HttpEndpoint,
        misfits: MisfitView | None = None,
    ) -> None:
        self.address = address
        self.families = MetricFamilies(version, misfits)
        self.probes = Probes(misfits)
        self.registry = self.families.registry
        self.rpc_done = self.families.rpc_done
        self._endpoint = endpoint(address, self)

    # ---- sources, set by the daemon ------------------------------------------------------------
    @property
    def registrations(self) -> RegistrationState | None:
        return self.probes.registrations

    @registrations.setter
    def registrations(self, source: RegistrationState | None) -> None:
        self.probes.registrations = self.families.registrations = source

    @property
    def health(self) -> HealthView | None:
        return self.probes.health

    @health.setter
    def health(self, view: HealthView | None) -> None:
        self.probes.health = self.families.health = view

    # ---- StatusObserver (supervisor and server threads) ---------------------------------------
    def registered(self, resource: str, first: bool) -> None:
        self.families.registered(resource, first)

    def servers_changed(self, servers: Mapping[str, object]) -> None:
        self.families.servers_changed(servers)
        self.probes.served()

    def kubelet_lost(self) -> None:
        self.families.kubelet_lost()

    def reloaded(self, ok: bool) -> None:
        self.families.reloaded(ok)

    # ---- inputs -------------------------------------------------------------------------------
    def count_nvml_errors(self, nvml: Nvml) -> Nvml:
        """`nvml` with every failed call counted in nvdp_nvml_errors_total{call}."""
        return CountingNvml(nvml, self.families.nvml_error)

    # ---- Pages: what the endpoint serves -------------------------------------------------------
    def render_metrics(self) -> bytes:
        return self.registry.render()

    def liveness_problem(self) -> str | None:
        return self.probes.liveness_problem()

    def readiness_problem(self) -> str | None:
        return self.probes.readiness_problem()

    # ---- the endpoint -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 before start."""
        return self._endpoint.port

    def start(self) -> None:
        """Serve on the address. Raises NvdpError when it cannot bind."""
        self._endpoint.start()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        self._endpoint.stop()
