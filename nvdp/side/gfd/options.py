"""`nvdp gfd` flags and env vars: NVIDIA's gpu-feature-discovery names, defaults and precedence.

- The plugin options gfd shares are flags here (GFD's own env names first, e.g.
  `GFD_MIG_STRATEGY`); the other plugin settings are read from env vars only.
- All resolve with gfd's rules (`nvdp.config.rules.gfd_problems`): a flag, else its env var, else
  the config file (`flags.gfd`, `flags.useNodeFeatureAPI`), else NVIDIA's default.
- `--sleep-interval infinite` labels once and sleeps until a signal.
- `--use-node-feature-api` unset is None: true where the Node Feature API can be used (decided at
  start, `nvdp.side.gfd.run.default_output`), else the feature file.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from nvdp.base.errors import ConfigError
from nvdp.config import PLUGIN_OPTIONS, Config, GfdFlags, PluginOptions, resolve_command
from nvdp.config import values as v
from nvdp.config.groups import (
    KUBE_API_LIMITS,
    KUBECONFIG,
    NODE_NAME,
    SERVICE_ACCOUNT_NAMESPACE,
    pod_namespace,
)
from nvdp.config.model import INFINITE
from nvdp.config.options import Option, add_options, flag, flags_only_for
from nvdp.config.rules import gfd_problems

DEFAULT_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_SLEEP_INTERVAL_S = 60.0

# The plugin flags GFD shares (NVIDIA's gpu-feature-discovery accepts these), by canonical name.
SHARED_FLAGS = (
    "--mig-strategy --fail-on-init-error --driver-root --driver-root-ctr-path --device-discovery-strategy"
    " --resource-name-prefix --config-file --nvml --log-format --log-level"
).split()
# GFD's own env var names for shared settings, read before the plugin's (a bad flag value is named
# with the plugin's).
_GFD_ENVS = {
    "--mig-strategy": "GFD_MIG_STRATEGY",
    "--fail-on-init-error": "GFD_FAIL_ON_INIT_ERROR",
    "--config-file": "GFD_CONFIG_FILE",
    "--resource-name-prefix": "GFD_RESOURCE_NAME_PREFIX",
}


def _seconds(text: str) -> float:
    if text == INFINITE:
        return math.inf
    if text.isdigit():  # urfave/cli reads a bare number as a Go duration, which needs a unit
        raise v.InvalidValue(f'invalid duration "{text}" (use a unit, e.g. 60s)')
    value = v.parse_go_duration(text)
    if value <= 0:
        raise v.InvalidValue(f'must be positive, got "{text}"')
    return value


GFD_OPTIONS: tuple[Option, ...] = (
    *(
        replace(o, envs=(_GFD_ENVS[o.names[0]], *o.envs), flag_env=o.envs[0])
        if o.names[0] in _GFD_ENVS
        else o
        for o in flags_only_for(SHARED_FLAGS, PLUGIN_OPTIONS)
        if o.names[0] not in (NODE_NAME.names[0], KUBECONFIG.names[0])  # gfd's own, below
    ),
    flag("--oneshot $GFD_ONESHOT", v.parse_bool, "label once and exit"),
    flag("--no-timestamp $GFD_NO_TIMESTAMP", v.parse_bool, "do not add the timestamp label"),
    flag(
        "--sleep-interval $GFD_SLEEP_INTERVAL",
        _seconds,
        "time to sleep between labelings; infinite: label once, then sleep until a signal",
        "seconds",
    ),
    flag("--output-file --output -o $GFD_OUTPUT_FILE", v.string, "the NFD feature file"),
    flag(
        "--machine-type-file $GFD_MACHINE_TYPE_FILE", v.string, "a file holding the node's DMI product name"
    ),
    flag(
        "--use-node-feature-api $GFD_USE_NODE_FEATURE_API $USE_NODE_FEATURE_API",
        v.parse_bool,
        "publish labels as an NFD NodeFeature object instead of the feature file (unset: where the API "
        "server serves NodeFeature objects)",
    ),
    NODE_NAME,
    flag(
        "--pod-name $POD_NAME",
        v.string,
        "this pod's name: its DaemonSet and it own the NodeFeature object (garbage-collected with them)",
    ),
    flag(
        "--namespace $KUBERNETES_NAMESPACE $NAMESPACE",
        v.string,
        "namespace of the NodeFeature object (when unset: POD_NAMESPACE, else the service account's)",
    ),
    KUBECONFIG,
    *KUBE_API_LIMITS,
)


@dataclass(frozen=True)
class GfdSettings(PluginOptions):
    """The plugin's options gfd reads, and gfd's own."""

    oneshot: bool = False
    no_timestamp: bool = False
    sleep_interval: float = DEFAULT_SLEEP_INTERVAL_S
    output_file: str = DEFAULT_OUTPUT_FILE
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE
    use_node_feature_api: bool | None = None  # None: where the Node Feature API is served
    node_name: str = ""
    pod_name: str = ""
    namespace: str = ""
    kubeconfig: str = ""  # empty: in-cluster credentials
    kube_api_qps: float = 5.0  # NVIDIA's defaults; see nvdp.config.groups.KUBE_API_LIMITS
    kube_api_burst: int = 10


def add_gfd_flags(parser: argparse.ArgumentParser) -> None:
    """Register GFD's own flags and the plugin flags it shares."""
    add_options(parser, GFD_OPTIONS, GfdSettings)


def _from_file(config: Config) -> dict[str, object]:
    """GFD's settings in the config file: `flags.gfd` and `flags.useNodeFeatureAPI`, where set."""
    values = {f.name: getattr(config.flags.gfd, f.name) for f in fields(GfdFlags) if config.flags.gfd}
    values["use_node_feature_api"] = config.flags.use_node_feature_api
    return {key: value for key, value in values.items() if value is not None}


def resolve_gfd(
    args: argparse.Namespace, environ: Mapping[str, str], token_dir: str | None = None
) -> GfdSettings:
    """The effective GFD settings. Raises ConfigError listing every problem."""
    settings = resolve_command(
        GfdSettings, GFD_OPTIONS, args, environ, rules=gfd_problems, from_file=_from_file
    )
    if not settings.namespace:
        namespace = environ.get("POD_NAMESPACE") or pod_namespace(token_dir or SERVICE_ACCOUNT_NAMESPACE)
        settings = replace(settings, namespace=namespace)
    if settings.use_node_feature_api and not settings.node_name:
        raise ConfigError("--use-node-feature-api: the node name is required (--node-name / NODE_NAME)")
    if settings.use_node_feature_api and not settings.namespace:
        raise ConfigError(
            "--use-node-feature-api: the namespace is required (--namespace / KUBERNETES_NAMESPACE)"
        )
    return settings
