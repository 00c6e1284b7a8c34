"""Flags and env vars of `nvdp config-manager`: NVIDIA's names, env vars and defaults (urfave/cli in
cmd/config-manager), with the shared Kubernetes client, node name and logging groups, plus nvdp's
`--poll-interval` (how often the mounted ConfigMap is re-read where inotify is unavailable) and
`--configmap-name` / `--namespace` (the mounted ConfigMap, watched through the API as well).
Precedence: a flag on the command line, else its env var, else the default. Every problem is one
line of a `ConfigError`, naming the flag or the env var that was given.
"""

from __future__ import annotations

import argparse
import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nvdp.base.errors import ConfigError
from nvdp.config import values as v
from nvdp.config.groups import KUBECONFIG, LOGGING, NODE_NAME, SERVICE_ACCOUNT_NAMESPACE, pod_namespace
from nvdp.config.options import add_options, flag, read_options
from nvdp.config.runtime import listen_address
from nvdp.side.configmanager.spread import DEFAULT_SPREAD_S

DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_PROCESS_TO_SIGNAL = "nvidia-device-plugin"
FALLBACK_STRATEGIES = ("named", "single", "empty")
NAMED_FALLBACK = "default"  # the entry the `named` strategy looks for
# The Node annotation recording the entry last put in place on the node (value: the entry name; ""
# for the empty config), read when a restarted pod's label names no usable entry. An nvdp-named key
# (the `nvdp.` subdomain), not NVIDIA's `nvidia.com/` prefix that the label uses: NVIDIA's
# config-manager writes no such record, and a key of theirs could one day mean something else.
APPLIED_ANNOTATION = "nvdp.nvidia.com/device-plugin.config.applied"
# The pod's namespace, where --namespace is not given (the ConfigMap a pod mounts is in its namespace).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a ConfigMap's name
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace


@dataclass(frozen=True)
class Settings:
    node_name: str
    config_file_srcdir: str
    config_file_dst: str
    oneshot: bool = False
    kubeconfig: str | None = None  # None: in-cluster credentials
    node_label: str = DEFAULT_NODE_LABEL
    default_config: str = ""
    fallback_strategies: tuple[str, ...] = ()
    send_signal: bool = True
    signal: int = int(signal.SIGHUP)
    process_to_signal: str = DEFAULT_PROCESS_TO_SIGNAL
    poll_interval: float = 2.0
    metrics_address: str = ""
    strict_config: bool = False
    configmap_name: str = ""  # "": the mounted ConfigMap only, as NVIDIA's config-manager
    namespace: str = ""  # the ConfigMap's; "": the pod's (its service account's)
    configmap_spread: float = DEFAULT_SPREAD_S  # an API-heard edit waits random() * this
    log_format: str = "text"
    log_level: str = "info"


def _signal_number(text: str) -> int:
    return v.integer(1, 64)(int(text) if text.strip().lstrip("-").isdigit() else text)


def _named(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text and not pattern.fullmatch(text):
            raise v.InvalidValue(f"not a valid {what}, got {v.show(text)}")
        return text

    return parse


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return v.parse_go_duration(text)


def _nonnegative_seconds(text: str) -> float:
    seconds = _seconds(text)
    if not seconds > 0:
        raise v.InvalidValue(f"must be > 0, got {v.show(text)}")
    return seconds


def _seconds_or_zero(text: str) -> float:
    seconds = _seconds(text)
    if not seconds >= 0:
        raise v.InvalidValue(f"must be >= 0, got {v.show(text)}")
    return seconds


_DECLARED = (
    flag("--oneshot $ONESHOT", v.parse_bool, "check and update the config once, then exit"),
    KUBECONFIG,
    NODE_NAME,
    flag("--node-label $NODE_LABEL", v.string, "the label that selects the config"),
    flag(
        "--config-file-srcdir $CONFIG_FILE_SRCDIR",
        v.string,
        "directory of the available config files (the mounted ConfigMap)",
    ),
    flag(
        "--config-file-dst $CONFIG_FILE_DST",
        v.string,
        "the config file path the plugin reads; made a symlink to the selected file",
    ),
    flag("--default-config $DEFAULT_CONFIG", v.string, "the entry to use when the node has no label"),
    flag(
        "--fallback-strategies $FALLBACK_STRATEGIES",
        lambda text: v.list_of(v.choice(*FALLBACK_STRATEGIES))(v.split_list(text)),
        "ordered fallbacks without label and default: named (an entry called default), single (the "
        "only entry), empty (an empty config)",
        "list",
    ),
    flag("--send-signal $SEND_SIGNAL", v.parse_bool, "signal <process-to-signal> when the config changed"),
    flag("--signal $SIGNAL", _signal_number, "the signal number to send"),
    flag(
        "--process-to-signal $PROCESS_TO_SIGNAL",
        v.string,
        "name (or absolute path) of the process to signal: its executable, or the script an interpreter runs",
    ),
    flag(
        "--poll-interval $NVDP_CONFIG_POLL_INTERVAL",
        _nonnegative_seconds,
        "where inotify is unavailable: how often the mounted ConfigMap is re-read for edits (seconds or Go"
        " duration); with inotify (Linux) edits are seen as they happen",
        "seconds",
    ),
    flag(
        "--metrics-address $METRICS_ADDRESS",
        listen_address,
        'nvdp: listen address of /metrics, /healthz and /readyz ("" disables; /readyz fails while the'
        " node watch has been failing or silent for a minute, or the selected config is not in place)",
        empty="value",
    ),
    flag(
        "--strict-config $STRICT_CONFIG",
        v.parse_bool,
        "nvdp: refuse entries with unknown keys, as the plugin does with the same setting",
    ),
    flag(
        "--configmap-name $CONFIGMAP_NAME",
        _named(_DNS_SUBDOMAIN, "ConfigMap name"),
        "nvdp: the ConfigMap mounted at --config-file-srcdir, also watched through the API (RBAC: get,"
        " list, watch on it) so that an edit applies in seconds, not when the kubelet refreshes the"
        ' mount; the mount stays the fallback ("": the mount only)',
    ),
    flag(
        "--namespace $NAMESPACE",
        _named(_DNS_LABEL, "namespace"),
        "nvdp: the namespace of --configmap-name (when unset: the pod's, from its service account)",
    ),
    flag(
        "--configmap-spread $NVDP_CONFIGMAP_SPREAD",
        _seconds_or_zero,
        "nvdp: an edit of --configmap-name heard through the API applies after a random delay of up to"
        " this (seconds or Go duration), so that a fleet does not reload in one second"
        " (0: at once)",
        "seconds",
    ),
    *LOGGING,
)
# A bad value is named by the flag or the env var that was given, as NVIDIA's config-manager does.
OPTIONS = tuple(replace(option, label="given") for option in _DECLARED)
_REQUIRED = ("node_name", "node_label", "config_file_srcdir", "config_file_dst")


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_options(parser, OPTIONS, Settings)


def resolve(
    args: argparse.Namespace, environ: Mapping[str, str], namespace_file: str = SERVICE_ACCOUNT_NAMESPACE
) -> Settings:
    """Settings from flags > env > defaults. Raises ConfigError listing every problem."""
    given, problems = read_options(OPTIONS, args, environ)
    for option in OPTIONS:
        field = option.field
        if field in _REQUIRED and (not given[field] if field in given else field != "node_label"):
            problems.append(f"{option.names[0]} / {option.envs[0]}: must not be empty")
    if problems:
        raise ConfigError(problems)
    kwargs: dict[str, Any] = {**given, "kubeconfig": given.get("kubeconfig") or None}
    settings = Settings(**kwargs)
    if settings.configmap_name and not settings.namespace:
        settings = replace(settings, namespace=pod_namespace(namespace_file))
        if not settings.namespace:
            raise ConfigError(
                "--configmap-name: the namespace is required (--namespace / NAMESPACE; in a pod, the"
                f" service account's {namespace_file} is read)"
            )
    return settings
