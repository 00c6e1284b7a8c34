"""The resolved config mapped onto what the plugin daemon runs with: the supervisor's `DaemonSettings`
(resource rules, Allocate answers' options, CDI settings, and the health settings of
`nvdp.node.health.settings`), and the one node fact that mapping reads, the IMEX channels present
(`imex_channels`).

What nvdp refuses is decided before, by the config's validation (`nvdp.config.rules`); the mapping
itself (`daemon_settings`) is pure and total: it never raises.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvdp.base.errors import ConfigError
from nvdp.config import Config, RuntimeOptions
from nvdp.config.model import DEFAULT_KUBELET_SOCKET
from nvdp.node.cdi.names import MODE_CLASSES, CdiSettings, cdi_enabled, imex_channel_path
from nvdp.node.cdi.roots import visible_roots
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.health.settings import health_settings
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.types import DaemonSettings


def daemon_settings(
    config: Config, imex_channels: tuple[int, ...] = (), runtime: RuntimeOptions | None = None
) -> DaemonSettings:
    """Map the resolved v1 config and runtime options onto what the supervisor needs. `imex_channels`
    are the configured IMEX channels present on the node (a node fact the caller reads:
    `imex_channels`); the side commands that only build resources pass neither."""
    runtime = runtime or RuntimeOptions()
    flags = config.flags
    plugin = flags.plugin
    return DaemonSettings(
        cdi=cdi_settings(config, runtime, imex_channels),
        # Empty: serve without registering, the sockets where the kubelet's default socket is (NVIDIA).
        kubelet_socket=Path(plugin.kubelet_socket or DEFAULT_KUBELET_SOCKET),
        register_with_kubelet=bool(plugin.kubelet_socket),
        fail_on_init_error=flags.fail_on_init_error,
        container_driver_root=plugin.container_driver_root,
        rules=ResourceRules.of(config),
        health=health_settings(config),
        response=ResponseOptions(
            device_list_strategy=plugin.device_list_strategy,
            device_id_strategy=plugin.device_id_strategy,
            pass_device_specs=plugin.pass_device_specs,
            dev_root=flags.dev_root,
            cdi_annotation_prefix=plugin.cdi_annotation_prefix,
            extra_envs=feature_envs(config),
            mps_root=flags.mps_root,
            cdi_kind=runtime.cdi_kind,
            imex_channels=imex_channels,
        ),
    )


def feature_envs(config: Config) -> tuple[tuple[str, str], ...]:
    """Env vars NVIDIA's plugin adds to every container for GDS, MOFED and GDRCopy; the NVIDIA
    container toolkit acts on them. (The IMEX channels' one goes with the device list env var:
    `nvdp.plugins.deviceplugin.responses`.)"""
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
    return tuple(envs)


def cdi_settings(
    config: Config, runtime: RuntimeOptions, imex_channels: tuple[int, ...] = ()
) -> CdiSettings | None:
    """The CDI settings, or None when no CDI device-list strategy is on (no specs are written)."""
    flags = config.flags
    plugin = flags.plugin
    if not cdi_enabled(plugin.device_list_strategy):
        return None
    modes = dict(
        zip(MODE_CLASSES, (flags.gds_enabled, flags.mofed_enabled, flags.gdrcopy_enabled), strict=True)
    )
    return CdiSettings(
        spec_dir=runtime.cdi_spec_dir,
        gpu_kind=runtime.cdi_kind,
        id_strategy=plugin.device_id_strategy,
        driver_root=flags.nvidia_driver_root,
        container_driver_root=plugin.container_driver_root,
        dev_root=flags.dev_root,
        hook_path=plugin.nvidia_ctk_path,
        disabled_hooks=runtime.cdi_disable_hooks,
        feature_flags=plugin.cdi_feature_flags,
        modes=tuple(m for m, on in modes.items() if on),
        imex_channels=imex_channels,
    )


def imex_channels(config: Config) -> tuple[int, ...]:
    """The configured IMEX channels whose device node exists under the dev root. With
    `imex.required` a missing channel is refused (ConfigError, one line), as NVIDIA's plugin does;
    without it the channel is left out."""
    flags = config.flags
    dev_root = flags.dev_root
    _, dev_here = visible_roots(flags.nvidia_driver_root, dev_root, flags.plugin.container_driver_root)
    present = []
    for channel in config.imex.channel_ids:
        path = imex_channel_path(channel)
        here = path if dev_here in ("", "/") else os.path.join(dev_here, path.lstrip("/"))
        if os.path.exists(here):
            present.append(channel)
        elif config.imex.required:
            raise ConfigError(
                f"imex.required: IMEX channel {channel} not found ({path} under dev root {dev_root}); "
                "create the channel or set imex.required to false"
            )
    return tuple(present)
