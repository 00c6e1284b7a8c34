"""Flags and env vars of `nvdp config-manager`: NVIDIA's names, env vars and defaults (urfave/cli in
cmd/config-manager), plus nvdp's `--poll-interval` (how often the mounted ConfigMap is re-read where
inotify is unavailable).
Precedence: a flag on the command line, else its env var, else the default. Every problem is one
line of a `ConfigError`.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nvdp.config import values as v
from nvdp.config.model import listen_address
from nvdp.errors import ConfigError

DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_PROCESS_TO_SIGNAL = "nvidia-device-plugin"
FALLBACK_STRATEGIES = ("named", "single", "empty")
NAMED_FALLBACK = "default"  # the entry the `named` strategy looks for
# The Node annotation recording the entry last put in place on the node (value: the entry name; ""
# for the empty config), read when a restarted pod's label names no usable entry. An nvdp-named key
# (the `nvdp.` subdomain), not NVIDIA's `nvidia.com/` prefix that the label uses: NVIDIA's
# config-manager writes no such record, and a key of theirs could one day mean something else.
APPLIED_ANNOTATION = "nvdp.nvidia.com/device-plugin.config.applied"


@dataclass(frozen=True)
class Settings:
    node_name: str
    config_file_srcdir: str
    config_file_dst: str
    oneshot: bool = False
    kubeconfig: str | None = None
    node_label: str = DEFAULT_NODE_LABEL
    default_config: str = ""
    fallback_strategies: tuple[str, ...] = ()
    send_signal: bool = True
    signal: int = int(signal.SIGHUP)
    process_to_signal: str = DEFAULT_PROCESS_TO_SIGNAL
    poll_interval: float = 2.0
    metrics_address: str = ""
    strict_config: bool = False


def _signal_number(text: str) -> int:
    number = v.integer(1, 64)(int(text) if text.strip().lstrip("-").isdigit() else text)
    return number


def _nonnegative_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = v.parse_go_duration(text)
    if not seconds > 0:
        raise v.InvalidValue(f"must be > 0, got {v.show(text)}")
    return seconds


# flag, env var, Settings field, parser, kind ("bool": the flag alone means true), help
_Parser = Callable[[str], Any]
_OPTIONS: tuple[tuple[str, str, str, _Parser, str, str], ...] = (
    ("--oneshot", "ONESHOT", "oneshot", v.parse_bool, "bool", "check and update the config once, then exit"),
    ("--kubeconfig", "KUBECONFIG", "kubeconfig", v.string, "value", "kubeconfig file (default: in-cluster)"),
    ("--node-name", "NODE_NAME", "node_name", v.string, "value", "the node whose label selects the config"),
    ("--node-label", "NODE_LABEL", "node_label", v.string, "value", "the label that selects the config"),
    (
        "--config-file-srcdir",
        "CONFIG_FILE_SRCDIR",
        "config_file_srcdir",
        v.string,
        "value",
        "directory of the available config files (the mounted ConfigMap)",
    ),
    (
        "--config-file-dst",
        "CONFIG_FILE_DST",
        "config_file_dst",
        v.string,
        "value",
        "the config file path the plugin reads; made a symlink to the selected file",
    ),
    (
        "--default-config",
        "DEFAULT_CONFIG",
        "default_config",
        v.string,
        "value",
        "the entry to use when the node has no label",
    ),
    (
        "--fallback-strategies",
        "FALLBACK_STRATEGIES",
        "fallback_strategies",
        lambda text: tuple(v.list_of(v.choice(*FALLBACK_STRATEGIES))(v.split_list(text))),
        "list",
        "ordered fallbacks without label and default: named (an entry called default), single (the "
        "only entry), empty (an empty config)",
    ),
    (
        "--send-signal",
        "SEND_SIGNAL",
        "send_signal",
        v.parse_bool,
        "bool",
        "signal <process-to-signal> when the config changed",
    ),
    ("--signal", "SIGNAL", "signal", _signal_number, "value", "the signal number to send"),
    (
        "--process-to-signal",
        "PROCESS_TO_SIGNAL",
        "process_to_signal",
        v.string,
        "value",
        "name (or absolute path) of the process to signal: its executable, or the script an interpreter runs",
    ),
    (
        "--poll-interval",
        "NVDP_CONFIG_POLL_INTERVAL",
        "poll_interval",
        _nonnegative_seconds,
        "value",
        "where inotify is unavailable: how often the mounted ConfigMap is re-read for edits (seconds or Go"
        " duration); with inotify (Linux) edits are seen as they happen",
    ),
    (
        "--metrics-address",
        "METRICS_ADDRESS",
        "metrics_address",
        listen_address,
        "value",
        'nvdp: listen address of /metrics, /healthz and /readyz ("" disables; /readyz fails while the'
        " node watch has been failing or silent for a minute, or the selected config is not in place)",
    ),
    (
        "--strict-config",
        "STRICT_CONFIG",
        "strict_config",
        v.parse_bool,
        "bool",
        "nvdp: refuse entries with unknown keys, as the plugin does with the same setting",
    ),
)

_REQUIRED = ("node_name", "node_label", "config_file_srcdir", "config_file_dst")


def add_flags(parser: argparse.ArgumentParser) -> None:
    defaults = {"node_label": DEFAULT_NODE_LABEL, "send_signal": "true", "signal": "1"}
    defaults |= {"process_to_signal": DEFAULT_PROCESS_TO_SIGNAL, "oneshot": "false", "poll_interval": "2s"}
    for flag, env, field, _, kind, text in _OPTIONS:
        shown = f"; default {defaults[field]}" if field in defaults else ""
        extra: dict[str, Any] = {"nargs": "?", "const": "true", "metavar": "BOOL"} if kind == "bool" else {}
        if kind == "list":
            extra = {"action": "append"}
        parser.add_argument(flag, dest=field, default=None, help=f"{text} [env {env}{shown}]", **extra)


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Settings from flags > env > defaults. Raises ConfigError listing every problem."""
    problems: list[str] = []
    given: dict[str, Any] = {}
    for flag, env, field, parse, _, _ in _OPTIONS:
        value = getattr(args, field, None)
        if value is not None:
            text, label = (",".join(value) if isinstance(value, list) else str(value)), flag
        elif env in environ:
            text, label = environ[env], env
        else:
            continue
        try:
            given[field] = parse(text)
        except v.InvalidValue as error:
            problems.extend(f"{label}: {message}" for _, message in error.problems)
    for field in _REQUIRED:
        if field in given and not given[field] or field not in given and field != "node_label":
            flag, env = next((o[0], o[1]) for o in _OPTIONS if o[2] == field)
            problems.append(f"{flag} / {env}: must not be empty")
    if problems:
        raise ConfigError(problems)
    if not given.get("kubeconfig"):
        given["kubeconfig"] = None
    return Settings(**given)
