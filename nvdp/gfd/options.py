"""`nvdp gfd` flags and env vars: NVIDIA's gpu-feature-discovery names, defaults and precedence.

Shared settings (`--config-file`, `--mig-strategy`, `--fail-on-init-error`, `--nvidia-driver-root`,
`--driver-root-ctr-path`, `--device-discovery-strategy`, `--resource-name-prefix`, nvdp's `--nvml`,
logging) go through the plugin's resolver
(`nvdp.config.resolve`) with gfd's rules (`nvdp.config.rules.gfd_problems`: the plugin's, less the
settings gfd never uses, such as an MPS root); GFD's own settings are then resolved here: a flag,
else its env var, else the config file's `flags.gfd` (`flags.useNodeFeatureAPI`), else NVIDIA's
default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nvdp.config import Config, resolve
from nvdp.config import values as v
from nvdp.config.options import OPTIONS
from nvdp.config.rules import gfd_problems
from nvdp.errors import ConfigError, UnreadableFile
from nvdp.files import read_bounded

DEFAULT_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_SLEEP_INTERVAL_S = 60.0
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

# The plugin flags GFD shares (NVIDIA's gpu-feature-discovery accepts these), by canonical name.
SHARED_FLAGS = (
    "--mig-strategy",
    "--fail-on-init-error",
    "--driver-root",
    "--driver-root-ctr-path",
    "--device-discovery-strategy",
    "--resource-name-prefix",
    "--config-file",
    "--nvml",
    "--log-format",
    "--log-level",
)
# GFD's extra env var names for shared settings, read before the plugin's (GFD_MIG_STRATEGY...).
_GFD_ALIASES = {
    "MIG_STRATEGY": "GFD_MIG_STRATEGY",
    "FAIL_ON_INIT_ERROR": "GFD_FAIL_ON_INIT_ERROR",
    "CONFIG_FILE": "GFD_CONFIG_FILE",
}


@dataclass(frozen=True)
class GfdOption:
    names: tuple[str, ...]
    env: str
    key: str  # attribute of GfdSettings
    parse: Callable[[str], object]
    help: str
    is_bool: bool = False
    aliases: tuple[str, ...] = ()  # more env var names, read after `env`

    @property
    def envs(self) -> tuple[str, ...]:
        return (self.env, *self.aliases)

    @property
    def dest(self) -> str:
        return "gfd_" + self.names[0][2:].replace("-", "_")


def _seconds(text: str) -> float:
    if text.isdigit():  # urfave/cli reads a bare number as a Go duration, which needs a unit
        raise v.InvalidValue(f'invalid duration "{text}" (use a unit, e.g. 60s)')
    value = v.parse_go_duration(text)
    if value <= 0:
        raise v.InvalidValue(f'must be positive, got "{text}"')
    return value


def _qps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise v.InvalidValue(f"must be a number >= 0, got {v.show(text)}") from None
    if not value >= 0 or value == float("inf"):
        raise v.InvalidValue(f"must be a number >= 0, got {v.show(text)}")
    return value


def _burst(text: str) -> int:
    return v.integer(0)(int(text) if text.isascii() and text.isdigit() else text)


GFD_OPTIONS = (
    GfdOption(("--oneshot",), "GFD_ONESHOT", "oneshot", v.parse_bool, "label once and exit", True),
    GfdOption(
        ("--no-timestamp",),
        "GFD_NO_TIMESTAMP",
        "no_timestamp",
        v.parse_bool,
        "do not add the timestamp label",
        True,
    ),
    GfdOption(
        ("--sleep-interval",),
        "GFD_SLEEP_INTERVAL",
        "sleep_interval",
        _seconds,
        "time to sleep between labelings",
    ),
    GfdOption(
        ("--output-file", "--output", "-o"),
        "GFD_OUTPUT_FILE",
        "output_file",
        v.string,
        "the NFD feature file",
    ),
    GfdOption(
        ("--machine-type-file",),
        "GFD_MACHINE_TYPE_FILE",
        "machine_type_file",
        v.string,
        "a file holding the node's DMI product name",
    ),
    GfdOption(
        ("--use-node-feature-api",),
        "GFD_USE_NODE_FEATURE_API",
        "use_node_feature_api",
        v.parse_bool,
        "publish labels as an NFD NodeFeature object instead of the feature file",
        True,
        ("USE_NODE_FEATURE_API",),
    ),
    GfdOption(("--node-name",), "NODE_NAME", "node_name", v.string, "this node's name (for the NodeFeature)"),
    GfdOption(
        ("--namespace",),
        "KUBERNETES_NAMESPACE",
        "namespace",
        v.string,
        "namespace of the NodeFeature object",
        aliases=("NAMESPACE",),  # NVIDIA's newest gfd reads NAMESPACE
    ),
    GfdOption(
        ("--kubeconfig",),
        "KUBECONFIG",
        "kubeconfig",
        v.string,
        "kubeconfig file for the Node Feature API (in-cluster credentials when empty)",
    ),
    # NVIDIA's client rate limits. Validated, not applied: nvdp's GFD makes at most two API
    # requests per labeling pass (docs/gfd.md), far below any limit these could set.
    GfdOption(
        ("--kube-api-qps",), "KUBE_API_QPS", "kube_api_qps", _qps, "API queries per second (not applied)"
    ),
    GfdOption(
        ("--kube-api-burst",), "KUBE_API_BURST", "kube_api_burst", _burst, "API request burst (not applied)"
    ),
)


@dataclass(frozen=True)
class GfdSettings:
    config: Config
    oneshot: bool = False
    no_timestamp: bool = False
    sleep_interval: float = DEFAULT_SLEEP_INTERVAL_S
    output_file: str = DEFAULT_OUTPUT_FILE
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE
    use_node_feature_api: bool = False
    node_name: str = ""
    namespace: str = ""
    kubeconfig: str = ""  # --kubeconfig / KUBECONFIG; empty: in-cluster credentials
    kube_api_qps: float = 5.0  # NVIDIA's defaults; see GFD_OPTIONS
    kube_api_burst: int = 10


def add_gfd_flags(parser: argparse.ArgumentParser) -> None:
    """Register GFD's own flags and the plugin flags it shares."""
    shared = argparse.ArgumentParser(add_help=False)
    from nvdp.config import add_plugin_flags

    add_plugin_flags(shared)
    wanted = {o.dest for o in OPTIONS if o.names[0] in SHARED_FLAGS}
    for action in shared._actions:  # copy the shared subset, help and all
        if action.dest in wanted:
            parser._add_action(action)
    defaults = GfdSettings(config=Config())
    for option in GFD_OPTIONS:
        extra: dict[str, object] = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        default = getattr(defaults, option.key)
        shown = str(default).lower() if isinstance(default, bool) else f'"{default}"'
        if not option.is_bool:
            extra = {"metavar": option.key.upper()}
        if option.key == "sleep_interval":
            shown = "60s"
        parser.add_argument(
            *option.names,
            dest=option.dest,
            default=None,
            help=f"{option.help} [env {', '.join(option.envs)}; default {shown}]",
            **extra,  # type: ignore[arg-type]
        )


def resolve_gfd(
    args: argparse.Namespace, environ: Mapping[str, str], token_dir: str | None = None
) -> GfdSettings:
    """The effective GFD settings. Raises ConfigError listing every problem."""
    env = dict(environ)
    for plugin_env, gfd_env in _GFD_ALIASES.items():
        if gfd_env in env:
            env[plugin_env] = env[gfd_env]
    problems: list[str] = []
    try:
        config = resolve(args, env, rules=gfd_problems)
    except ConfigError as error:
        problems.extend(error.problems)
        config = Config()
    file_gfd = config.flags.gfd
    values: dict[str, object] = {}
    if file_gfd is not None:
        for key in ("oneshot", "no_timestamp", "sleep_interval", "output_file", "machine_type_file"):
            if getattr(file_gfd, key) is not None:
                values[key] = getattr(file_gfd, key)
    if config.flags.use_node_feature_api is not None:
        values["use_node_feature_api"] = config.flags.use_node_feature_api
    for option in GFD_OPTIONS:
        given = getattr(args, option.dest, None)
        env_name = next((name for name in option.envs if name in env), option.env)
        label = f"{option.names[0]} / {env_name}"
        text = str(given) if given is not None else env.get(env_name)
        if text is None:
            continue
        try:
            values[option.key] = option.parse(text)
        except v.InvalidValue as error:
            problems.extend(f"{label}: {message}" for _, message in error.problems)
    if problems:
        raise ConfigError(problems)
    if not values.get("namespace"):
        values["namespace"] = env.get("POD_NAMESPACE") or _read(token_dir or SERVICE_ACCOUNT_NAMESPACE)
    settings = GfdSettings(config=config, **values)  # type: ignore[arg-type]
    if settings.use_node_feature_api and not settings.node_name:
        raise ConfigError("--use-node-feature-api: the node name is required (--node-name / NODE_NAME)")
    if settings.use_node_feature_api and not settings.namespace:
        raise ConfigError(
            "--use-node-feature-api: the namespace is required (--namespace / KUBERNETES_NAMESPACE)"
        )
    return settings


def _read(path: str) -> str:
    """The service account's namespace ("" when there is none: a namespace is at most 63 bytes)."""
    try:
        return read_bounded(path, 4096).decode("utf-8", errors="replace").strip()
    except UnreadableFile:
        return ""
