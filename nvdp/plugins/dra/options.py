"""`nvdp dra-kubelet-plugin` flags and env vars, with NVIDIA's DRA kubelet plugin's names and defaults.

- NVIDIA's: `--node-name`, `--cdi-root`, `--kubelet-registrar-directory-path`,
  `--kubelet-plugins-directory-path`, `--kubeconfig`, `--nvidia-driver-root`,
  `--container-driver-root`, `--nvidia-cdi-hook-path` (env: the upper-case names).
- The plugin's: `--nvml`, logging, `--config-file` (its `health` section), `--metrics-address`
  (`nvdp.plugins.dra.status`), `--device-rescan-interval` (0.5 s: a MIG re-partition shows within a second).
- Precedence and errors are the plugin family's (`nvdp.config.precedence.resolve_command`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nvdp.base.errors import ConfigError
from nvdp.base.units import format_go_duration
from nvdp.config import PLUGIN_OPTIONS, PluginOptions, RuntimeOptions, resolve_command
from nvdp.config import values as v
from nvdp.config.groups import KUBECONFIG, NODE_NAME
from nvdp.config.options import Option, add_options, flag, read_options, with_values
from nvdp.config.rules import dra_problems
from nvdp.plugins.dra.names import DRIVER_NAME, PLUGIN_SOCKET, REGISTRATION_SOCKET

DEFAULT_CDI_ROOT = "/etc/cdi"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_RESCAN_INTERVAL_S = 0.5
MAX_SOCKET_PATH = 107  # bytes, sun_path less its terminating NUL

# The plugin options the DRA plugin takes as flags, by canonical name.
SHARED_FLAGS = (
    "--config-file --nvml --log-format --log-level --driver-root --dev-root --driver-root-ctr-path"
    " --nvidia-cdi-hook-path --cdi-disable-hooks --device-rescan-interval --metrics-address --mps-root"
).split()

DRA_OPTIONS: tuple[Option, ...] = (
    *(o for o in PLUGIN_OPTIONS if o.names[0] in SHARED_FLAGS),
    NODE_NAME,
    flag("--cdi-root $CDI_ROOT", v.string, "directory the claims' CDI specs are written to"),
    flag(
        "--kubelet-registrar-directory-path $KUBELET_REGISTRAR_DIRECTORY_PATH",
        v.string,
        "the kubelet's plugin registration directory (plugins_registry)",
    ),
    flag(
        "--kubelet-plugins-directory-path $KUBELET_PLUGINS_DIRECTORY_PATH",
        v.string,
        f"the kubelet's plugins directory; the DRA socket and checkpoint go in its {DRIVER_NAME}/",
    ),
    KUBECONFIG,
)


@dataclass(frozen=True)
class DraSettings(PluginOptions):
    """The plugin options the DRA plugin reads, and its own."""

    runtime: RuntimeOptions = field(
        default_factory=lambda: RuntimeOptions(device_rescan_interval=DEFAULT_RESCAN_INTERVAL_S)
    )
    node_name: str = ""
    cdi_root: str = DEFAULT_CDI_ROOT
    kubelet_registrar_directory_path: str = DEFAULT_REGISTRAR_DIR
    kubelet_plugins_directory_path: str = DEFAULT_PLUGINS_DIR
    kubeconfig: str = ""  # empty: in-cluster credentials

    def to_json(self) -> str:
        """One line of JSON for the start-up log: what this command uses of its settings."""
        flags, runtime = self.config.flags, self.runtime
        logged = {
            "nodeName": self.node_name,
            "nvml": runtime.nvml,
            "configFile": runtime.config_file,
            "cdiRoot": self.cdi_root,
            "registrationSocket": str(self.registration_socket),
            "pluginSocket": str(self.plugin_socket),
            "nvidiaDriverRoot": flags.nvidia_driver_root,
            "devRoot": flags.dev_root,
            "containerDriverRoot": flags.plugin.container_driver_root,
            "nvidiaCDIHookPath": flags.plugin.nvidia_ctk_path,
            "cdiDisableHooks": list(runtime.cdi_disable_hooks),
            "deviceRescanInterval": format_go_duration(runtime.device_rescan_interval),
            "metricsAddress": runtime.metrics_address,
            "health": self.config.to_dict().get("health"),
        }
        return json.dumps(logged, separators=(",", ":"), ensure_ascii=False)

    @property
    def registration_socket(self) -> Path:
        return Path(self.kubelet_registrar_directory_path) / REGISTRATION_SOCKET

    @property
    def plugin_dir(self) -> Path:
        return Path(self.kubelet_plugins_directory_path) / DRIVER_NAME

    @property
    def plugin_socket(self) -> Path:
        return self.plugin_dir / PLUGIN_SOCKET


def add_dra_flags(parser: argparse.ArgumentParser) -> None:
    add_options(parser, DRA_OPTIONS, DraSettings)


def resolve_dra(args: argparse.Namespace, environ: Mapping[str, str]) -> DraSettings:
    """The effective settings. Raises ConfigError listing every problem: the plugin family's (bad
    values, the config file), then the DRA plugin's own (node name, socket paths)."""
    given, _ = read_options(DRA_OPTIONS, args, environ)
    own = with_values(DraSettings(), {k: v for k, v in given.items() if k in _OWN_CHECKED})
    problems = _own_problems(own)
    try:
        settings = resolve_command(DraSettings, DRA_OPTIONS, args, environ, rules=dra_problems)
    except ConfigError as error:
        raise ConfigError([*error.problems, *problems]) from error
    if problems:
        raise ConfigError(problems)
    return settings


_OWN_CHECKED = ("node_name", "kubelet_registrar_directory_path", "kubelet_plugins_directory_path")


def _own_problems(settings: DraSettings) -> list[str]:
    problems = []
    if not settings.node_name:
        problems.append("--node-name / NODE_NAME: required (the node whose GPUs are published)")
    for what, path in (
        (
            "--kubelet-registrar-directory-path / KUBELET_REGISTRAR_DIRECTORY_PATH",
            settings.registration_socket,
        ),
        ("--kubelet-plugins-directory-path / KUBELET_PLUGINS_DIRECTORY_PATH", settings.plugin_socket),
    ):
        directory = path.parent if path.name == REGISTRATION_SOCKET else path.parent.parent
        if not path.is_absolute():
            problems.append(f"{what}: must be an absolute path, got {str(directory)!r}")
        elif len(str(path).encode()) > MAX_SOCKET_PATH:
            problems.append(f"{what}: the socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
    return problems
