"""The resolved config mapped onto what the plugin daemon runs with (pure and total: never raises).

What nvdp refuses is decided before, by the config's validation (`nvdp.config.rules`); this module
only translates a valid `Config` into the supervisor's `DaemonSettings` and the health settings.
"""

from __future__ import annotations

from pathlib import Path

from nvdp.cdi.names import imex_channel_path
from nvdp.cdi.settings import cdi_settings
from nvdp.config import Config, RuntimeOptions
from nvdp.health.types import DEFAULT_DEGRADED_GRACE_PERIOD, HealthSettings
from nvdp.plugin.responses import ResponseOptions
from nvdp.plugin.types import DaemonSettings
from nvdp.resources import NamePattern, Replication


def daemon_settings(
    config: Config, imex_channels: tuple[int, ...] = (), runtime: RuntimeOptions | None = None
) -> DaemonSettings:
    """Map the resolved v1 config and runtime options onto what the supervisor needs. `imex_channels`
    are the configured IMEX channels present on the node (a node fact the caller reads:
    `nvdp.cdi.settings.imex_channels`); the side commands that only build resources pass neither."""
    runtime = runtime or RuntimeOptions()
    flags = config.flags
    plugin = flags.plugin
    return DaemonSettings(
        cdi=cdi_settings(config, runtime, imex_channels),
        kubelet_socket=Path(plugin.kubelet_socket),
        mig_strategy=flags.mig_strategy,
        fail_on_init_error=flags.fail_on_init_error,
        container_driver_root=plugin.container_driver_root,
        gpu_patterns=tuple(NamePattern(r.pattern, r.name) for r in config.resources.gpus),
        mig_patterns=tuple(NamePattern(r.pattern, r.name) for r in config.resources.mig),
        sharing=sharing_rules(config),
        health=health_settings(config),
        allocation_policy=plugin.shared_devices_allocation_policy,
        response=ResponseOptions(
            device_list_strategy=plugin.device_list_strategy,
            device_id_strategy=plugin.device_id_strategy,
            pass_device_specs=plugin.pass_device_specs,
            dev_root=flags.dev_root,
            cdi_annotation_prefix=plugin.cdi_annotation_prefix,
            extra_envs=feature_envs(config),
            mps_root=flags.mps_root,
            cdi_kind=runtime.cdi_kind,
            imex_channel_paths=tuple(imex_channel_path(c) for c in imex_channels),
        ),
    )


def sharing_rules(config: Config) -> tuple[Replication, ...]:
    """One replication rule per `sharing.<strategy>.resources` entry (none without sharing)."""
    replicated = config.sharing.replicated
    if replicated is None:
        return ()
    return tuple(
        Replication(
            name=entry.name,
            replicas=entry.replicas,
            rename=entry.rename,
            devices=entry.devices,
            strategy=config.sharing.strategy,
            fail_requests_greater_than_one=bool(replicated.fail_requests_greater_than_one),
        )
        for entry in replicated.resources
    )


def feature_envs(config: Config) -> tuple[tuple[str, str], ...]:
    """Env vars NVIDIA's plugin adds to every container for GDS, MOFED, GDRCopy and IMEX channels;
    the NVIDIA container toolkit acts on them."""
    flags = config.flags
    envs = [
        (name, "enabled")
        for name, on in (
            ("NVIDIA_GDS", flags.gds_enabled),
            ("NVIDIA_MOFED", flags.mofed_enabled),
            ("NVIDIA_GDRCOPY", flags.gdrcopy_enabled),
        )
        if on
    ]
    if config.imex.channel_ids:
        envs.append(("NVIDIA_IMEX_CHANNELS", ",".join(str(c) for c in config.imex.channel_ids)))
    return tuple(envs)


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
    )
