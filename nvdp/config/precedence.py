"""The precedence of the commands that read the config file, per setting: a flag, else its env var,
else the file (`--config-file` / `CONFIG_FILE`), else NVIDIA's default. `resolve` is the plugin's;
`resolve_command` takes a command's own options, settings class and rules (gfd, the MPS daemon).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from nvdp.base.errors import ConfigError
from nvdp.config.groups import PLUGIN_OPTIONS
from nvdp.config.load import load_file
from nvdp.config.model import Config
from nvdp.config.options import Option, add_options, read_options, with_values
from nvdp.config.rules import plugin_problems
from nvdp.config.runtime import PluginOptions

P = TypeVar("P", bound=PluginOptions)


def add_plugin_flags(parser: argparse.ArgumentParser) -> None:
    """Register every plugin flag. Unset flags stay None so `resolve` can tell them from given ones."""
    add_options(parser, PLUGIN_OPTIONS, PluginOptions)


def resolve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    file_loader: Callable[[str], Config] = load_file,
    rules: Callable[[Config], list[str]] = plugin_problems,
) -> PluginOptions:
    """The plugin's effective options. Raises ConfigError listing every problem (bad flag / env values,
    the file's problems, the `rules` from `nvdp.config.rules`: the plugin's by default)."""
    return resolve_command(PluginOptions, PLUGIN_OPTIONS, args, environ, file_loader=file_loader, rules=rules)


def resolve_command(
    settings: type[P],
    options: Sequence[Option],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    rules: Callable[[Config], list[str]],
    file_loader: Callable[[str], Config] = load_file,
    from_file: Callable[[Config], Mapping[str, object]] | None = None,
) -> P:
    """`settings` from `options`: flag > env var > config file > default. `from_file` maps the loaded
    file onto settings of the command's own (gfd's `flags.gfd`), below its flags and env vars. Raises
    ConfigError listing every problem: the file's first, then bad values, then the `rules`."""
    given, problems = read_options(options, args, environ)
    config_file = str(given.pop("runtime.config_file", "")) or None
    strict = given.get("runtime.strict_config") is True
    config = Config()
    file_ok = True
    if config_file:
        try:
            config = load_file(config_file, strict=True) if strict else file_loader(config_file)
        except ConfigError as error:
            file_ok = False
            problems[:0] = [f"{error.source}: {p}" if error.source else p for p in error.problems]
    values = {**(from_file(config) if from_file else {}), **given, "runtime.config_file": config_file}
    resolved = with_values(settings(config=config), values)
    resolved = with_values(resolved, {"config.flags.nvidia_dev_root": resolved.config.flags.dev_root})
    if file_ok:
        problems += rules(resolved.config)
    if problems:
        raise ConfigError(problems)
    return resolved
