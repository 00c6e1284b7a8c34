"""Prometheus metrics and the daemon's HTTP endpoint: /metrics, /healthz, /readyz, /allocations.

- `families`: the counted metric families and the StatusObserver counting into them; the state
  read at scrape time.
- `readiness`: /healthz and /readyz, from the supervisor's registration state.
- `allocations`: /allocations and nvdp_device_allocated, from the allocation ledger.
- `nvml_errors`: failed NVML calls; `sources`: the protocols through which all of them read the
  daemon; `service`: `Metrics`, the parts put together.
- The exposition is `nvdp.base.promtext`; the HTTP server is `nvdp.base.http_endpoint` (shared with the
  config-manager, which must not import grpc through this package).
- Nothing here imports prometheus_client, ssl, http.client or email (megabytes of RSS) or the
  concrete plugin server; `nvdp.plugins.deviceplugin.daemon` imports this package only when metrics are on.
"""

from nvdp.base.http_endpoint import Endpoint, HttpEndpoint, Pages, parse_address
from nvdp.plugins.metrics.allocations import AllocationPages
from nvdp.plugins.metrics.families import MetricFamilies
from nvdp.plugins.metrics.readiness import SOCKET_GRACE_S, Probes
from nvdp.plugins.metrics.service import Metrics
from nvdp.plugins.metrics.sources import HealthView, MisfitView, PluginServerView, RegistrationState

__all__ = [
    "SOCKET_GRACE_S",
    "AllocationPages",
    "Endpoint",
    "HealthView",
    "HttpEndpoint",
    "MetricFamilies",
    "Metrics",
    "MisfitView",
    "Pages",
    "PluginServerView",
    "Probes",
    "RegistrationState",
    "parse_address",
]
