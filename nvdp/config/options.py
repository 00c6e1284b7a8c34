"""The one flag / env var framework of every nvdp command: `Option`, its argparse flags, a resolver.

- A value comes from its flag, else from the first of its env vars that is set.
- Every bad value is one line naming the flag and the env var, all reported at once.
- An env var set to "" is unset (NVIDIA's chart passes `SIGNAL=""`), except a boolean's, which is
  false (urfave/cli's BoolFlag), and one with `empty="value"` (an empty KUBELET_SOCKET serves
  without registering; an empty METRICS_ADDRESS turns the endpoint off).
- A flag's help names its env vars and its default, read from the command's settings class.
- The groups several commands share are in `nvdp.config.groups`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from nvdp.config import values as v

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]  # the flags: the first is the canonical one, the others aliases
    envs: tuple[str, ...]  # read in order; the first one defined counts
    parse: Callable[[str], object]  # with v.parse_bool the flag alone means true
    help: str
    kind: Literal["value", "list", "seconds"] = "value"  # list: repeatable, comma-separated
    target: str = ""  # dotted field path in the command's settings; by default the flag's name
    label: Literal["flag and env", "given"] = "flag and env"  # what names a bad value
    flag_env: str = ""  # the env var named with a bad flag value; by default the first
    has_flag: bool = True  # False: read from the env vars only (the command has no such flag)
    empty: Literal["unset", "value"] = "unset"  # an env var set to "": unset, or the value "" to parse

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")

    @property
    def field(self) -> str:
        return self.target or self.dest

    @property
    def reads_empty_env(self) -> bool:
        """Whether an env var set to "" is read (as "") rather than taken as unset."""
        return self.empty == "value" or self.parse is v.parse_bool

    def problem_label(self, source: str) -> str:
        """What names a bad value that came from `source` (a flag or an env var)."""
        if self.label == "given":
            return source
        env = source if source in self.envs else self.flag_env or next(iter(self.envs), "")
        return " / ".join(name for name in (self.names[0], env) if name)


def flag(
    spec: str,
    parse: Callable[[str], object],
    help: str,
    kind: Literal["value", "list", "seconds"] = "value",
    *,
    target: str = "",
    label: Literal["flag and env", "given"] = "flag and env",
    empty: Literal["unset", "value"] = "unset",
) -> Option:
    """An option from its flags and `$`-marked env vars, as a help line shows them:
    `flag("--driver-root --nvidia-driver-root $NVIDIA_DRIVER_ROOT", ...)`."""
    words = spec.split()
    envs = tuple(w[1:] for w in words if w.startswith("$"))
    names = tuple(w for w in words if not w.startswith("$"))
    return Option(names, envs, parse, help, kind, target, label, empty=empty)


def under(prefix: str, options: Iterable[Option]) -> tuple[Option, ...]:
    """A group mounted at `prefix` of the command's settings."""
    return tuple(replace(o, target=f"{prefix}.{o.field}") for o in options)


def flags_only_for(names: Iterable[str], options: Iterable[Option]) -> tuple[Option, ...]:
    """`options` where only those with one of `names` are flags; the others are read from env only."""
    wanted = set(names)
    return tuple(o if wanted & set(o.names) else replace(o, has_flag=False) for o in options)


def add_options(
    parser: argparse.ArgumentParser, options: Iterable[Option], settings: type[DataclassInstance]
) -> None:
    """Register the flags; an unset one stays None. `settings`: the class the defaults are read from."""
    for option in (o for o in options if o.has_flag):
        extra: dict[str, Any] = {"action": "append"} if option.kind == "list" else {}
        if option.parse is v.parse_bool:
            extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        notes = [f"env {', '.join(option.envs)}"] if option.envs else []
        default = _default(settings, option.field)
        if default is not None:
            notes.append(f"default {_show(default, option.kind)}")
        help = f"{option.help} [{'; '.join(notes)}]" if notes else option.help
        parser.add_argument(
            *option.names, dest=option.dest, default=None, help=help.replace("%", "%%"), **extra
        )


def read_options(
    options: Iterable[Option], args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[dict[str, object], list[str]]:
    """The value of each option given (its field -> value), and one line per bad value."""
    found: dict[str, object] = {}
    problems: list[str] = []
    for option in options:
        flag = getattr(args, option.dest, None) if option.has_flag else None
        if flag is not None:
            source, text = option.names[0], ",".join(flag) if isinstance(flag, list) else str(flag)
        else:
            source = next((env for env in option.envs if _is_set(option, environ.get(env))), "")
            if not source:
                continue
            text = environ[source]
        try:
            found[option.field] = option.parse(text)
        except v.InvalidValue as error:
            problems.extend(f"{option.problem_label(source)}: {message}" for _, message in error.problems)
    return found, problems


def _is_set(option: Option, value: str | None) -> bool:
    return value is not None and (value != "" or option.reads_empty_env)


def with_values(settings: T, found: Mapping[str, object]) -> T:
    """`settings` (frozen dataclasses) with each dotted field set to its value."""
    for target, value in found.items():
        settings = _set(settings, target, value)
    return settings


def _set(obj: Any, target: str, value: object) -> Any:
    head, _, rest = target.partition(".")
    return replace(obj, **{head: _set(getattr(obj, head), rest, value) if rest else value})


def _default(settings: type[DataclassInstance], target: str) -> object:
    """The default of a dotted field of the settings class; None where it has none."""
    head, _, rest = target.partition(".")
    field = next(f for f in fields(settings) if f.name == head)
    value = field.default if field.default_factory is MISSING else field.default_factory()
    for name in rest.split(".") if rest and value is not MISSING else ():
        value = getattr(value, name)
    return None if value is MISSING else value


def _show(default: object, kind: str) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float):
        return f"{default:g}s" if kind == "seconds" else f"{default:g}"
    if isinstance(default, str | tuple):
        return '"' + (default if isinstance(default, str) else ",".join(map(str, default))) + '"'
    return str(default)
