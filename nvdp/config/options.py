"""Command-line flags and environment variables of `nvdp plugin` / `nvidia-device-plugin`.

The names, env vars and defaults are NVIDIA's (urfave/cli in cmd/nvidia-device-plugin), plus nvdp's
own `--nvml`, `--log-format`, `--log-level` and `--metrics-address`. Precedence, per setting:
a flag given on the command line, else its env var (the first defined one; a defined but empty
variable counts, as with urfave/cli), else the config file, else the default. The config file path
itself comes from `--config-file` / `CONFIG_FILE`. Call `resolve` again to reload (SIGHUP).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nvdp.config import values as v
from nvdp.config.load import load_file
from nvdp.config.model import (
    CDI_HOOKS,
    CDI_KINDS,
    DEVICE_DISCOVERY_STRATEGIES,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    MIG_STRATEGIES,
    RESOURCE_NAME_PREFIX,
    SHARED_DEVICES_ALLOCATION_POLICIES,
    Config,
    imex_channel_ids,
    listen_address,
    nvml_spec,
    rescan_interval,
)
from nvdp.config.rules import plugin_problems
from nvdp.errors import ConfigError
from nvdp.logs import LOG_FORMATS, LOG_LEVELS


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]  # the first is the canonical flag, the others aliases
    envs: tuple[str, ...]
    target: str  # dotted attribute path in Config, e.g. "flags.plugin.device_id_strategy"
    parse: Callable[[str], object]
    help: str
    kind: str = "value"  # "bool": the flag alone means true; "list": repeatable, comma-separated

    @property
    def dest(self) -> str:
        return self.names[0][2:].replace("-", "_")

    def label(self, env: str | None = None) -> str:
        return f"{self.names[0]} / {env or self.envs[0]}"


def _listed(convert: Callable[[object], object]) -> Callable[[str], object]:
    return lambda text: convert(v.split_list(text))


_device_lists = v.list_of(v.choice(*DEVICE_LIST_STRATEGIES), min_items=1)


def _channel_ids(text: str) -> object:
    return imex_channel_ids([int(i) if i.isascii() and i.isdigit() else i for i in v.split_list(text)])


def _alts(choices: tuple[str, ...]) -> str:
    return " | ".join(choices)


def _resource_name_prefix(text: str) -> str:
    """NVIDIA's --resource-name-prefix: accepted with its default value, refused with any other
    (nvdp's resource names, CDI kinds and labels are built on nvidia.com)."""
    if text != RESOURCE_NAME_PREFIX:
        raise v.InvalidValue(f"{v.show(text)} is not supported by nvdp (only {RESOURCE_NAME_PREFIX})")
    return text


OPTIONS: tuple[Option, ...] = (
    Option(
        ("--mig-strategy",),
        ("MIG_STRATEGY",),
        "flags.mig_strategy",
        v.choice(*MIG_STRATEGIES),
        f"strategy for exposing MIG devices on GPUs that support it: {_alts(MIG_STRATEGIES)}",
    ),
    Option(
        ("--fail-on-init-error",),
        ("FAIL_ON_INIT_ERROR",),
        "flags.fail_on_init_error",
        v.parse_bool,
        "fail if an error occurs during initialization, otherwise block indefinitely",
        "bool",
    ),
    Option(
        ("--driver-root", "--nvidia-driver-root"),
        ("NVIDIA_DRIVER_ROOT",),
        "flags.nvidia_driver_root",
        v.string,
        "root of the NVIDIA driver installation on the host (e.g. / or /run/nvidia/driver)",
    ),
    Option(
        ("--dev-root", "--nvidia-dev-root"),
        ("NVIDIA_DEV_ROOT",),
        "flags.nvidia_dev_root",
        v.string,
        "root path of the NVIDIA device nodes on the host (default: the driver root)",
    ),
    Option(
        ("--pass-device-specs",),
        ("PASS_DEVICE_SPECS",),
        "flags.plugin.pass_device_specs",
        v.parse_bool,
        "pass the list of DeviceSpecs to the kubelet on Allocate()",
        "bool",
    ),
    Option(
        ("--device-list-strategy",),
        ("DEVICE_LIST_STRATEGY",),
        "flags.plugin.device_list_strategy",
        _listed(_device_lists),
        f"how the device list reaches the runtime, one or more of {_alts(DEVICE_LIST_STRATEGIES)}",
        "list",
    ),
    Option(
        ("--device-id-strategy",),
        ("DEVICE_ID_STRATEGY",),
        "flags.plugin.device_id_strategy",
        v.choice(*DEVICE_ID_STRATEGIES),
        f"how device IDs are passed to the runtime: {_alts(DEVICE_ID_STRATEGIES)}",
    ),
    Option(
        ("--gdrcopy-enabled",),
        ("GDRCOPY_ENABLED",),
        "flags.gdrcopy_enabled",
        v.parse_bool,
        "start containers that get GPUs with GDRCopy support",
        "bool",
    ),
    Option(
        ("--gds-enabled",),
        ("GDS_ENABLED",),
        "flags.gds_enabled",
        v.parse_bool,
        "start containers that get GPUs with GPUDirect Storage support",
        "bool",
    ),
    Option(
        ("--mofed-enabled",),
        ("MOFED_ENABLED",),
        "flags.mofed_enabled",
        v.parse_bool,
        "start containers that get GPUs with MOFED support",
        "bool",
    ),
    Option(
        ("--kubelet-socket",),
        ("KUBELET_SOCKET",),
        "flags.plugin.kubelet_socket",
        v.string,
        "the kubelet's registration socket; plugin sockets go in its directory",
    ),
    Option(
        ("--config-file",),
        ("CONFIG_FILE",),
        "config_file",
        v.string,
        "path to a v1 config file (YAML or JSON); flags and env vars override it",
    ),
    Option(
        ("--cdi-annotation-prefix",),
        ("CDI_ANNOTATION_PREFIX",),
        "flags.plugin.cdi_annotation_prefix",
        v.string,
        "prefix of CDI container annotation keys",
    ),
    Option(
        ("--nvidia-cdi-hook-path", "--nvidia-ctk-path"),
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        "flags.plugin.nvidia_ctk_path",
        v.string,
        "path of the NVIDIA CDI hook in generated CDI specs",
    ),
    Option(
        ("--driver-root-ctr-path", "--container-driver-root"),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        "flags.plugin.container_driver_root",
        v.string,
        "where the driver root is mounted in this container (for CDI specs and libnvidia-ml)",
    ),
    Option(
        ("--mps-root",),
        ("MPS_ROOT",),
        "flags.mps_root",
        v.string,
        "host path where the MPS control daemon creates its files (required for MPS sharing)",
    ),
    Option(
        ("--device-discovery-strategy",),
        ("DEVICE_DISCOVERY_STRATEGY",),
        "flags.device_discovery_strategy",
        v.choice(*DEVICE_DISCOVERY_STRATEGIES),
        f"how devices are discovered: {_alts(DEVICE_DISCOVERY_STRATEGIES)}",
    ),
    Option(
        ("--imex-channel-ids",),
        ("IMEX_CHANNEL_IDS",),
        "imex.channel_ids",
        _channel_ids,
        "IMEX channels to inject ([] or 0)",
        "list",
    ),
    Option(
        ("--imex-required",),
        ("IMEX_REQUIRED",),
        "imex.required",
        v.parse_bool,
        "the IMEX channels must exist",
        "bool",
    ),
    Option(
        ("--cdi-feature-flags",),
        ("CDI_FEATURE_FLAGS",),
        "flags.plugin.cdi_feature_flags",
        _listed(v.list_of(v.string)),
        "feature flags passed to CDI spec generation",
        "list",
    ),
    Option(
        ("--shared-devices-allocation-policy",),
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        "flags.plugin.shared_devices_allocation_policy",
        v.choice(*SHARED_DEVICES_ALLOCATION_POLICIES),
        "preferred allocation of replicas and MIG devices: "
        f"{_alts(SHARED_DEVICES_ALLOCATION_POLICIES)} (least-used or most-used parent first)",
    ),
    Option(
        ("--cdi-disable-hooks",),
        ("CDI_DISABLE_HOOKS",),
        "cdi_disable_hooks",
        _listed(v.list_of(v.choice(*CDI_HOOKS))),
        f"createContainer hooks left out of generated CDI specs: {_alts(CDI_HOOKS)}",
        "list",
    ),
    Option(
        ("--resource-name-prefix",),
        ("RESOURCE_NAME_PREFIX",),
        "resource_name_prefix",
        _resource_name_prefix,
        f"prefix of the resource names; nvdp supports only {RESOURCE_NAME_PREFIX}",
    ),
    # nvdp's own
    Option(
        ("--cdi-spec-dir",),
        ("CDI_SPEC_DIR",),
        "cdi_spec_dir",
        v.string,
        "directory the CDI specs are written to (with a cdi-annotations / cdi-cri strategy)",
    ),
    Option(
        ("--cdi-kind",),
        ("CDI_KIND",),
        "cdi_kind",
        v.choice(*CDI_KINDS),
        f"kind of the GPU CDI devices in specs and answers: {_alts(CDI_KINDS)} (nvidia-ctk's names)",
    ),
    Option(
        ("--nvml",),
        ("NVDP_NVML",),
        "nvml",
        nvml_spec,
        "NVML backend: real, sim:NAME (dgx-a100, dgx-a100-mig, pcie-4, dgx-h100) or sim:/path/node.yaml",
    ),
    Option(
        ("--log-format",),
        ("LOG_FORMAT",),
        "log_format",
        v.choice(*LOG_FORMATS),
        f"log line format: {_alts(LOG_FORMATS)}",
    ),
    Option(
        ("--log-level",),
        ("LOG_LEVEL",),
        "log_level",
        v.choice(*LOG_LEVELS),
        f"lowest level logged: {_alts(LOG_LEVELS)}",
    ),
    Option(
        ("--metrics-address",),
        ("METRICS_ADDRESS",),
        "metrics_address",
        listen_address,
        'listen address of /metrics, /healthz and /readyz ("" disables)',
    ),
    Option(
        ("--device-rescan-interval",),
        ("DEVICE_RESCAN_INTERVAL",),
        "device_rescan_interval",
        rescan_interval,
        'how often MIG layouts and GPUs are re-read to serve changes without a signal ("10s"; 0 disables)',
    ),
    Option(
        ("--strict-config",),
        ("STRICT_CONFIG",),
        "strict_config",
        v.parse_bool,
        "refuse a config file with unknown keys (by default each one is a warning and is ignored)",
        "bool",
    ),
)


def add_plugin_flags(parser: argparse.ArgumentParser) -> None:
    """Register every plugin flag. Unset flags stay None so `resolve` can tell them from given ones."""
    defaults = Config()
    for option in OPTIONS:
        default = _get(defaults, option.target)
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        shown = f'"{default}"' if isinstance(default, str) else str(default).lower()
        help = f"{option.help} [env {' or '.join(option.envs)}; default {shown}]".replace("%", "%%")
        extra: dict[str, Any] = {"action": "append"} if option.kind == "list" else {}
        if option.kind == "bool":
            extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        parser.add_argument(*option.names, dest=option.dest, default=None, help=help, **extra)


def resolve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    file_loader: Callable[[str], Config] = load_file,
    rules: Callable[[Config], list[str]] = plugin_problems,
) -> Config:
    """The effective config: flag > env var > config file > default. Raises ConfigError listing
    every problem (bad flag / env values, the file's problems, the command's `rules` from
    `nvdp.config.rules`: the plugin's by default)."""
    problems: list[str] = []
    given: dict[str, object] = {}
    for option in OPTIONS:
        found = _raw_value(option, args, environ)
        if found is None:
            continue
        env, text = found
        try:
            given[option.target] = option.parse(text)
        except v.InvalidValue as error:
            problems.extend(f"{option.label(env)}: {message}" for _, message in error.problems)
    config_file = str(given.pop("config_file", "")) or None
    strict = given.get("strict_config") is True
    config = Config()
    file_ok = True
    if config_file:
        try:
            config = load_file(config_file, strict=True) if strict else file_loader(config_file)
        except ConfigError as error:
            file_ok = False
            problems[:0] = [f"{error.source}: {p}" if error.source else p for p in error.problems]
    for target, value in given.items():
        config = _set(config, target, value)
    flags = replace(config.flags, nvidia_dev_root=config.flags.dev_root)
    config = replace(config, config_file=config_file, flags=flags)
    if file_ok:
        problems += rules(config)
    if problems:
        raise ConfigError(problems)
    return config


def _raw_value(
    option: Option, args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[str | None, str] | None:
    """(env var name or None for a flag, text) of the value given for `option`, if any."""
    value = getattr(args, option.dest, None)
    if value is not None:
        return None, ",".join(value) if isinstance(value, list) else str(value)
    for env in option.envs:
        if env in environ:
            return env, environ[env]
    return None


def _get(obj: object, target: str) -> object:
    for name in target.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj: Any, target: str, value: object) -> Any:
    head, _, rest = target.partition(".")
    return replace(obj, **{head: _set(getattr(obj, head), rest, value) if rest else value})
