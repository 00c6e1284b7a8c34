"""The config's `health` section as the health monitor's plain values: the one mapping the device
plugin (`nvdp.plugins.deviceplugin.daemon_settings`) and the DRA plugin (`nvdp.plugins.dra.loop`) both use."""

from __future__ import annotations

from nvdp.config.model import Config
from nvdp.node.health.types import DEFAULT_DEGRADED_GRACE_PERIOD, HealthSettings


def health_settings(config: Config) -> HealthSettings:
    """The config's `health` section as the monitor's plain values."""
    h = config.health
    return HealthSettings(
        ignored_xids=frozenset(h.ignored_xids),
        fatal_xids=None if h.fatal_xids is None else frozenset(h.fatal_xids),
        recovery_quiet_period=h.recovery_quiet_period,
        probe_interval=h.probe_interval,
        single_bit_ecc=h.single_bit_ecc,
        degraded_grace_period=(
            DEFAULT_DEGRADED_GRACE_PERIOD if h.degraded_grace_period is None else h.degraded_grace_period
        ),
        taint_on_fatal=h.taint_on_fatal,
    )
