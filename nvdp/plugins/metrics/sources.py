"""What metrics and the probes read from the rest of the daemon: the seams, as protocols.

The supervisor keeps the registration state and the plugin servers; the node's health keeps device
health and the monitor's status. Metrics read them at scrape or probe time through these protocols and
keep no copy (`nvdp.plugins.deviceplugin.supervisor.Supervisor`,
`nvdp.plugins.deviceplugin.server.DevicePluginServer`, `nvdp.node.health.node.NodeHealth`,
`nvdp.node.gpus.misfit_report.MisfitReport` and the allocation ledger,
`nvdp.plugins.ledger.ledger.AllocationLedger`, provide them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import Resource
from nvdp.node.health.types import HealthChange, MonitorStatus
from nvdp.plugins.ledger.types import LedgerSnapshot


class PluginServerView(Protocol):
    """One plugin server, as metrics and the probes read it."""

    @property
    def resource(self) -> Resource: ...

    @property
    def socket_path(self) -> Path: ...

    @property
    def open_streams(self) -> int: ...

    def health(self) -> Mapping[str, bool]:
        """Device id -> Healthy, as advertised in ListAndWatch."""
        ...

    def socket_is_ours(self) -> bool:
        """Whether the socket file is still the one this server listens on."""
        ...


class RegistrationState(Protocol):
    """The supervisor's servers and their registration with the running kubelet."""

    started: bool  # what to serve is decided (possibly nothing: no devices, or NVML failed)

    @property
    def servers(self) -> Mapping[str, PluginServerView]:
        """Resource name -> its server, for every resource served."""
        ...

    def registrations(self) -> Mapping[str, bool]:
        """Resource name -> registered with the running kubelet, for every resource served. A
        snapshot that any thread may take."""
        ...


class HealthView(Protocol):
    """The node's health as metrics and /readyz read it (`nvdp.node.health.node.NodeHealth`)."""

    @property
    def checks_enabled(self) -> bool: ...

    def monitor_status(self) -> MonitorStatus | None:
        """None until the monitor is created."""
        ...

    def unhealthy(self) -> Mapping[str, HealthChange]:
        """GPU/MIG uuid -> the change that made it Unhealthy."""
        ...


class MisfitView(Protocol):
    """The node facts that keep part of the config from applying
    (`nvdp.node.gpus.misfit_report.MisfitReport`)."""

    def current(self) -> list[Misfit]: ...

    def withheld(self) -> Mapping[str, str]:
        """Resource -> why the config's resource has no device on this node now."""
        ...

    def seen(self) -> Mapping[str, int]:
        """Reason -> misfits of that reason reported since start."""
        ...


class LedgerView(Protocol):
    """The allocation ledger as /allocations and the metrics read it
    (`nvdp.plugins.ledger.ledger.AllocationLedger`)."""

    def recent(self, max_age: float) -> LedgerSnapshot:
        """The kubelet's record, read at most `max_age` seconds ago where the kubelet answers at once,
        else the last read."""
        ...
