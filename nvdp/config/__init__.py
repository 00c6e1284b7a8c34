"""nvdp configuration: NVIDIA's v1 config file, flags and env vars, with the same precedence.

- `model`: the v1 file model as frozen dataclasses (`Config` and its sections: `version`, `flags`,
  `resources`, `sharing`, `imex`, and nvdp's `health` extension).
- `runtime`: what only flags and env vars set (`RuntimeOptions`: `nvml`, logging, metrics, CDI, ...)
  and `PluginOptions`, the config beside them; `options.to_json()` is the start-up log line.
- `load`: `load_file(path)`, `parse_text(text)`, `parse(mapping)` validate a file; every problem is
  one line naming the field, all reported at once in a `ConfigError`. Keys match in any letter case
  where NVIDIA's plugin matches them so (`notices`: one line per such key). `decode`: the text to
  plain data, within bounds.
- `options`: the one flag / env framework of every command (`Option`, `add_options`, `read_options`);
  `groups`: the groups several commands share (the plugin's settings, logging, NVML, Kubernetes
  client, node name); `precedence`: `add_plugin_flags(parser)` and `resolve(args, environ)`: flag >
  env > file > default.
- `rules`: what the plugin accepts across settings and what this version supports (checked by
  `resolve`).
- `values`: scalar checks shared by the others (Go durations: `nvdp.units`).

Strict about the config's form, tolerant about the node's facts: everything here is about the form
(types, unknown values, ranges, conflicting keys), decidable from flags, env and file alone, and
refused with one line per problem. Nothing here reads the node; what of a valid config does not fit
a node (an entry naming a resource the node lacks, a MIG GPU between layouts) is found where
resources are built (`nvdp.resources`) and reported as a misfit (`nvdp.misfits`), never refused.
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
