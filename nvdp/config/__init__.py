"""nvdp configuration: NVIDIA's v1 config file, flags and env vars, with the same precedence.

- `model`: the v1 file as frozen dataclasses (`Config`); `runtime`: `RuntimeOptions` (flags and
  env only) and `PluginOptions` (`options.to_json()` is the start-up log line).
- `load`: `load_file`, `parse_text`, `parse`; `decode`: text to plain data, bounded; `notices`: a
  line per key read in another case or applied unlike NVIDIA's plugin.
- `options`: the one flag / env framework; `groups`: shared flag groups; `precedence`:
  `add_plugin_flags(parser)`, `resolve(args, environ)`: flag > env > file > default.
- `rules`: what the plugin accepts and this version supports; `values`: shared scalar checks.
- Strict about form: bad types, values, ranges, conflicts are refused, one line each, all at once
  (`ConfigError`); nothing here reads the node. What does not fit a node is a misfit
  (`nvdp.node.gpus.resources`, `nvdp.node.gpus.misfits`), never refused.
"""

from nvdp.config.groups import PLUGIN_OPTIONS
from nvdp.config.load import load_file, parse, parse_text
from nvdp.config.model import (
    Config,
    Flags,
    GfdFlags,
    Health,
    Imex,
    NamePattern,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    Resources,
    Sharing,
)
from nvdp.config.precedence import add_plugin_flags, resolve, resolve_command
from nvdp.config.runtime import PluginOptions, RuntimeOptions
from nvdp.config.values import parse_go_duration

__all__ = [
    "PLUGIN_OPTIONS",
    "Config",
    "Flags",
    "GfdFlags",
    "Health",
    "Imex",
    "NamePattern",
    "PluginFlags",
    "PluginOptions",
    "ReplicatedResource",
    "ReplicatedResources",
    "Resources",
    "RuntimeOptions",
    "Sharing",
    "add_plugin_flags",
    "load_file",
    "parse",
    "parse_go_duration",
    "parse_text",
    "resolve",
    "resolve_command",
]
