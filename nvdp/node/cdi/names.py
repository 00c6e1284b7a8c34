"""CDI names and settings (pure): vendor, classes, qualified device names, spec file names.

Names follow NVIDIA's device plugin: vendor `k8s.device-plugin.nvidia.com`, class `gpu` with one
device per GPU / MIG device named by the device-ID strategy (a UUID, or `3` / `3:1` for index),
classes `gds`, `mofed`, `gdrcopy` with one device `all`, and class `imex-channel` with devices
`channel<N>`. The `gpu` class may be named `nvidia.com/gpu` instead (`--cdi-kind`), the kind
`nvidia-ctk cdi generate` writes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nvdp.config.model import (
    DEFAULT_CONTAINER_DRIVER_ROOT,
    DEFAULT_NVIDIA_CTK_PATH,
)
from nvdp.config.runtime import CDI_KINDS, DEFAULT_CDI_SPEC_DIR

# The CDI specification version written into a spec: the lowest that can express it, as the CDI
# library's MinimumRequiredVersion picks (runtimes whose CDI library predates a higher number refuse
# it). 0.5.0 for what every spec has (device nodes with a `hostPath`, device names that start with
# a digit for the index strategy); 0.7.0 only for a spec with `additionalGids` (a device node whose
# group others cannot use), as NVIDIA's spec does.
CDI_VERSION = "0.5.0"
CDI_VERSION_ADDITIONAL_GIDS = "0.7.0"
GPU_CLASS = "gpu"
IMEX_CLASS = "imex-channel"
MODE_CLASSES = ("gds", "mofed", "gdrcopy")
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"

# CDI device names: letters, digits, `_`, `-`, `.`, `:`, starting and ending with a letter or digit.
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class CdiSettings:
    """What CDI spec generation needs from the resolved configuration."""

    spec_dir: str = DEFAULT_CDI_SPEC_DIR
    gpu_kind: str = CDI_KINDS[0]  # NVIDIA's plugin's; or nvidia-ctk's (--cdi-kind)
    id_strategy: str = "uuid"  # or "index"
    driver_root: str = "/"  # the host's driver root (host paths in the spec)
    container_driver_root: str = DEFAULT_CONTAINER_DRIVER_ROOT  # where that root is mounted in this container
    dev_root: str = "/"  # the host's root for /dev/nvidia*
    hook_path: str = DEFAULT_NVIDIA_CTK_PATH  # --nvidia-cdi-hook-path
    disabled_hooks: tuple[str, ...] = ()  # of config.runtime.CDI_HOOKS
    feature_flags: tuple[str, ...] = ()  # of config.model.CDI_FEATURE_FLAGS (--cdi-feature-flags)
    modes: tuple[str, ...] = ()  # of MODE_CLASSES, from --gds-enabled and friends
    imex_channels: tuple[int, ...] = ()

    @property
    def vendor(self) -> str:
        return self.gpu_kind.partition("/")[0]

    def hook_enabled(self, name: str) -> bool:
        return "all" not in self.disabled_hooks and name not in self.disabled_hooks

    def feature(self, flag: str) -> bool:
        return flag in self.feature_flags


def cdi_enabled(device_list_strategy: Sequence[str]) -> bool:
    return any(s in CDI_STRATEGIES for s in device_list_strategy)


def valid_device_name(name: str) -> bool:
    return _DEVICE_NAME.fullmatch(name) is not None


def qualified_name(kind: str, device: str) -> str:
    """`vendor/class=device`, the name an Allocate answer carries."""
    return f"{kind}={device}"


def spec_file_name(kind: str) -> str:
    """The file name the CDI library derives for a spec of `kind`: `vendor-class.json`."""
    return kind.replace("/", "-") + ".json"


def imex_channel_name(channel: int) -> str:
    return f"channel{channel}"


def imex_channel_path(channel: int) -> str:
    return f"{IMEX_CHANNELS_DIR}/channel{channel}"
