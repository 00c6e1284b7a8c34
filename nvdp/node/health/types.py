"""What the health package hands around: its settings, the changes and status the monitor reports,
and the seam every plugin server offers the router (`HealthTarget`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nvdp.node.gpus.devices import DeviceSet

DEFAULT_DEGRADED_GRACE_PERIOD = 300.0


@dataclass(frozen=True)
class HealthSettings:
    """The config file's `health` section, as plain values (the supervisor maps config onto it).

    `fatal_xids` None means nvdp's default fatal set; a set replaces it. Times are seconds;
    `recovery_quiet_period` 0 disables recovery. `taint_on_fatal`: the effect of the Node taint of a
    node left without a healthy GPU (None: no taint; `nvdp.node.health.node_condition`).
    """

    ignored_xids: frozenset[int] = frozenset()
    fatal_xids: frozenset[int] | None = None
    recovery_quiet_period: float = 300.0
    probe_interval: float = 5.0
    single_bit_ecc: bool = False
    degraded_grace_period: float = DEFAULT_DEGRADED_GRACE_PERIOD
    taint_on_fatal: str | None = None

    def __post_init__(self) -> None:
        if self.recovery_quiet_period < 0:
            raise ValueError("recovery_quiet_period must be >= 0")
        if self.probe_interval <= 0:
            raise ValueError("probe_interval must be > 0")
        if self.degraded_grace_period < 0:
            raise ValueError("degraded_grace_period must be >= 0")


@dataclass(frozen=True)
class HealthChange:
    """One unit (a GPU or MIG uuid) changed health.

    `since` is the monitor clock's time of this transition; `xid` is None for non-XID causes
    (ECC events, a lost GPU, a probe finding).
    """

    uuid: str
    healthy: bool
    reason: str
    xid: int | None = None
    fatal: bool = False
    since: float = 0.0


@dataclass(frozen=True)
class MonitorStatus:
    """What the monitor itself is doing, for metrics and readiness."""

    running: bool
    degraded: bool
    reason: str | None
    last_error: str | None
    rearms: int
    events_by_xid: Mapping[int, int] = field(default_factory=dict)
    events_by_type: Mapping[str, int] = field(default_factory=dict)
    # Set when the monitor has been degraded beyond its grace period: why (what /readyz says).
    failing: str | None = None


class HealthTarget(Protocol):
    """A plugin server: what the router needs to push health to the kubelet."""

    @property
    def resource_name(self) -> str: ...

    @property
    def devices(self) -> DeviceSet: ...

    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        """Mark the devices and push ONE ListAndWatch update for all of them."""
        ...
