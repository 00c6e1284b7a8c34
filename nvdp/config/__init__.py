"""nvdp configuration: NVIDIA's v1 config file, flags and env vars, with the same precedence.

- `model`: the frozen dataclasses (`Config` and its sections). A `Config` is the v1 file model
  (`version`, `flags`, `resources`, `sharing`, `imex`, and nvdp's `health` extension) with flags and
  env merged in, plus the settings that only come from flags / env (`config_file`, `nvml`,
  `log_format`, `log_level`, `metrics_address`). `config.to_json()` is the start-up log line.
- `load`: `load_file(path)`, `parse_text(text)`, `parse(mapping)` validate a file; every problem is
  one line naming the field, all reported at once in a `ConfigError`.
- `options`: `add_plugin_flags(parser)` and `resolve(args, environ)`: flag > env > file > default.
- `rules`: what the plugin accepts across settings and what this version supports (checked by
  `resolve`).
- `values`: scalar checks shared by the three (Go durations: `nvdp.units`).

Strict about the config's form, tolerant about the node's facts: everything here is about the form
(types, unknown values, ranges, conflicting keys), decidable from flags, env and file alone, and
refused with one line per problem. Nothing here reads the node; what of a valid config does not fit
a node (an entry naming a resource the node lacks, a MIG GPU between layouts) is found where
resources are built (`nvdp.resources`) and reported as a misfit (`nvdp.misfits`), never refused.
"""

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
from nvdp.config.options import OPTIONS, add_plugin_flags, resolve
from nvdp.config.values import parse_go_duration

__all__ = [
    "OPTIONS",
    "Config",
    "Flags",
    "GfdFlags",
    "Health",
    "Imex",
    "NamePattern",
    "PluginFlags",
    "ReplicatedResource",
    "ReplicatedResources",
    "Resources",
    "Sharing",
    "add_plugin_flags",
    "load_file",
    "parse",
    "parse_go_duration",
    "parse_text",
    "resolve",
]
