"""From the resolved configuration to CDI settings, and the IMEX channels a node offers."""

from __future__ import annotations

import os

from nvdp.cdi.names import MODE_CLASSES, CdiSettings, cdi_enabled, imex_channel_path
from nvdp.cdi.scan import visible_roots
from nvdp.config import Config, RuntimeOptions
from nvdp.errors import ConfigError


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
