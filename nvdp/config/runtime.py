"""The settings only flags and env vars set (`RuntimeOptions`: no file key), and `PluginOptions`, what
the plugin family of commands runs with: the v1 config (`nvdp.config.model.Config`, file, flags and env
merged) beside the runtime options. `PluginOptions.to_json()` is the start-up log line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from nvdp.base.units import format_go_duration
from nvdp.config import values as v
from nvdp.config.model import RESOURCE_NAME_PREFIX, Config

DEFAULT_METRICS_ADDRESS = ":2112"
DEFAULT_DEVICE_RESCAN_INTERVAL = 10.0
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
CDI_KINDS = ("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu")  # NVIDIA's plugin's, nvidia-ctk's
# Who sees which pod holds which device on the metrics endpoint (--pod-detail): clients on the
# loopback only, or every client.
POD_DETAILS = ("local", "all")
# NVIDIA's CDI hook names (--cdi-disable-hooks): those nvdp's specs run (nvdp.node.cdi.edits.HOOKS),
# NVIDIA's deprecated `chmod` (which neither NVIDIA's spec nor nvdp's writes), and `all`.
CDI_HOOKS = (
    "create-symlinks",
    "enable-cuda-compat",
    "update-ldcache",
    "disable-device-node-modification",
    "update-application-profile",
    "chmod",
    "all",
)


def nvml_spec(value: object) -> str:
    text = v.string(value)
    if text != "real" and not (text.startswith("sim:") and len(text) > 4):
        raise v.InvalidValue(f"invalid value {v.show(text)} (accepted: real, sim:NAME, sim:/path/node.yaml)")
    return text


def listen_address(value: object) -> str:
    text = v.string(value)
    host, colon, port = text.rpartition(":")
    if text and not (colon and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise v.InvalidValue(f'invalid address {v.show(text)} (expected "[host]:port", or "" to disable)')
    return text


_seconds = v.duration()


def rescan_interval(value: object) -> float:
    """`--device-rescan-interval`: a Go duration ("10s", "1m") or a number of seconds; 0 disables."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        value = float(value)
    return _seconds(value)


@dataclass(frozen=True)
class RuntimeOptions:
    """What only flags and env vars set: how the process runs, never what the config file says."""

    config_file: str | None = None
    nvml: str = "real"
    log_format: str = "text"
    log_level: str = "info"
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    pod_detail: str = POD_DETAILS[0]  # /allocations and nvdp_device_allocated name pods to: local | all
    device_rescan_interval: float = DEFAULT_DEVICE_RESCAN_INTERVAL  # seconds; 0: no live rescans
    cdi_spec_dir: str = DEFAULT_CDI_SPEC_DIR
    cdi_kind: str = CDI_KINDS[0]
    cdi_disable_hooks: tuple[str, ...] = ()
    strict_config: bool = False  # unknown file keys are errors, not warnings
    resource_name_prefix: str = RESOURCE_NAME_PREFIX  # NVIDIA's flag; only the default is supported
    kubeconfig: str = ""  # empty: in-cluster credentials (when present)
    node_name: str = ""  # empty: no Node events, no Node condition


@dataclass(frozen=True)
class PluginOptions:
    """The resolved settings of the plugin (and of the commands that share its config)."""

    config: Config = field(default_factory=Config)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)

    def to_json(self) -> str:
        """One line of JSON for the start-up log: the file part plus the flag / env-only settings."""
        runtime = self.runtime
        logged = {
            "configFile": runtime.config_file,
            "nvml": runtime.nvml,
            "logFormat": runtime.log_format,
            "logLevel": runtime.log_level,
            "metricsAddress": runtime.metrics_address,
            "podDetail": runtime.pod_detail,
            "deviceRescanInterval": format_go_duration(runtime.device_rescan_interval),
            "cdiSpecDir": runtime.cdi_spec_dir,
            "cdiKind": runtime.cdi_kind,
            "cdiDisableHooks": list(runtime.cdi_disable_hooks),
        }
        return json.dumps({**self.config.to_dict(), **logged}, separators=(",", ":"), ensure_ascii=False)
