"""Reading and validating a v1 config file (YAML or JSON), as NVIDIA's plugin reads it.

The walk is driven by the dataclass field metadata in `nvdp.config.model`: unknown keys, wrong
types and invalid values each add one line naming the field path, and every problem is reported
at once in one `ConfigError` (at most MAX_PROBLEMS lines, then a count). `null` means "not set".
Like NVIDIA's plugin, an empty file and a file without `version` are v1 with defaults. Unknown keys
are lenient by default, the Kubernetes way: each one is a WARNING line (with a "did you mean" hint)
and the file loads, so a file written for a newer NVIDIA release still runs; `strict=True`
(`--strict-config`, `nvdp config check`) makes them errors. Unlike NVIDIA's plugin, duplicate keys
and sharing with both time-slicing and MPS are refused instead of silently ignored.

A path may name anything, so only a regular file of at most 1 MiB is read (`nvdp.files.read_bounded`:
`/dev/zero`, a FIFO or a directory is refused before it is read), and a mapping none of whose
top-level keys is a config key (`version`, `flags`, ...) is no config at all (a wrong path, say
`/etc/shadow`): it is refused with one line that quotes none of its content, never served on
defaults. Values quoted in messages are cut short (`nvdp.config.values.show`).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nvdp.config.model import MPS, SHARED_SUFFIX, TIME_SLICING, Config, Health, ReplicatedResources, Sharing
from nvdp.config.values import InvalidValue, describe_keys, show
from nvdp.errors import ConfigError, UnreadableFile
from nvdp.files import MAX_FILE_BYTES, read_bounded
from nvdp.logs import log_event
from nvdp.units import describe_size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

log = logging.getLogger(__name__)


def load_file(path: str | Path, *, strict: bool = False) -> Config:
    """Read and validate a config file. Raises ConfigError (source = the path) on any problem;
    unknown keys are problems only when `strict`, else one WARNING line each."""
    try:
        text = read_bounded(path, MAX_TEXT_BYTES).decode("utf-8")
    except UnreadableFile as error:
        raise ConfigError(f"cannot read config file: {error.reason}", source=str(path)) from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file is not UTF-8 text (byte {error.start})", source=str(path)) from error
    return parse_text(text, source=str(path), strict=strict)


def parse_text(text: str, source: str | None = None, *, strict: bool = False) -> Config:
    """Parse YAML or JSON text (JSON is tried first when the text starts with `{`)."""
    try:
        data = _decode(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError(_syntax_problem(error), source=source) from error
    return parse(data, source, strict=strict)


def parse(data: object, source: str | None = None, *, strict: bool = False) -> Config:
    """Validate decoded file content (a mapping; None is an empty file) into a Config."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        got = "a string" if isinstance(data, str) else show(data)  # quoting none of a one-line secret
        raise ConfigError(
            f"the config must be a mapping (version, flags, resources, ...), got {got}", source=source
        )
    if data and not any(key in _TOP_LEVEL_KEYS for key in data):
        raise ConfigError(
            f"not an nvdp/NVIDIA device plugin config: no known top-level key ({describe_keys(list(data))};"
            f" known: {', '.join(_TOP_LEVEL_KEYS)})",
            source=source,
        )
    problems: list[str] = []
    unknown: list[str] = problems if strict else []
    config = _build(Config, data, "", problems, unknown)
    if problems or config is None:
        raise ConfigError(_at_most(MAX_PROBLEMS, problems, "problems"), source=source)
    prefix = f"{source}: " if source else ""
    for line in _at_most(MAX_PROBLEMS, unknown, "unknown fields"):  # lenient: one line each, the plugin runs
        log_event(log, logging.WARNING, f"{prefix}{line}; ignored (--strict-config refuses it)")
    return config


MAX_PROBLEMS = 100  # lines reported for one file; a generated file may hold thousands of mistakes


def _at_most(limit: int, lines: list[str], what: str) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"and {len(lines) - limit} more {what}"]


_TOP_LEVEL_KEYS = tuple(f.metadata["key"] for f in fields(Config) if "key" in f.metadata)


# ---- decoding ----------------------------------------------------------------------------------

MAX_TEXT_BYTES = MAX_FILE_BYTES  # a ConfigMap holds at most 1 MiB
_MAX_PROBLEM_CHARS = 120  # a parser's message can quote the input: cut it short
_MAX_DIGITS = 40  # any integer a config needs fits; longer ones are refused before int() sees them


@cache
def _yaml_loader() -> Any:
    """The YAML loader, made on the first YAML text (a plugin without a config file never imports
    yaml): the pure-Python SafeLoader, which raises RecursionError on absurdly nested input where the
    C one crashes, refusing duplicate keys and absurdly long integers."""
    import yaml

    def mapping_without_duplicates(loader: Any, node: Any) -> Any:
        counts = Counter(key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode))
        duplicate = next((key for key, n in counts.items() if n > 1), None)
        if duplicate is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {show(duplicate)}", node.start_mark
            )
        return loader.construct_mapping(node)

    def bounded_int(loader: Any, node: Any) -> Any:
        if len(node.value) > _MAX_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, "number too large", node.start_mark)
        return loader.construct_yaml_int(node)

    loader: Any = type("_Loader", (yaml.SafeLoader,), {})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping_without_duplicates)
    loader.add_constructor("tag:yaml.org,2002:int", bounded_int)
    return loader


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    duplicate = next((key for key, n in Counter(k for k, _ in pairs).items() if n > 1), None)
    if duplicate is not None:
        raise ValueError(f"duplicate key {show(duplicate)}")
    return dict(pairs)


def _json_int(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise ValueError("number too large")
    return int(text)


def _decode(text: str) -> object:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ValueError(f"larger than {describe_size(MAX_TEXT_BYTES)}")
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int)
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; YAML's error message will tell
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: plain data only
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)  # a yaml.MarkedYAMLError's
        if mark is None:
            raise ValueError(str(error)) from error
        problem = _clip(str(getattr(error, "problem", "")))
        raise _YamlSyntax(
            f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        ) from error


class _YamlSyntax(ValueError):
    """A YAML syntax error, already said in one line."""


def _syntax_problem(error: BaseException) -> str:
    if isinstance(error, _YamlSyntax):
        return str(error)
    if isinstance(error, RecursionError):
        return "invalid config: nested too deeply"
    return "invalid config: " + _clip(str(error))


def _clip(message: str) -> str:
    """A parser's message on one line and cut short (it may quote the file, e.g. an alias name)."""
    words = " ".join(message.split())
    return words if len(words) <= _MAX_PROBLEM_CHARS else words[: _MAX_PROBLEM_CHARS - 3] + "..."


# ---- the walk ----------------------------------------------------------------------------------


def _join(path: str, key: object) -> str:
    name = key if isinstance(key, str) and re.fullmatch(r"[\w.-]+", key) else show(key)
    return f"{path}.{name}" if path else name


def _build(cls: type[T], value: object, path: str, problems: list[str], unknown: list[str]) -> T | None:
    """Build `cls` from a mapping, adding a line to `problems` for each problem; None if any.
    Unknown keys go to `unknown` (the same list as `problems` when strict)."""
    if not isinstance(value, Mapping):
        problems.append(f"{path}: must be a mapping, got {show(value)}")
        return None
    start = len(problems)
    by_key = {f.metadata["key"]: f for f in fields(cls) if "key" in f.metadata}
    for key in value:
        if key not in by_key:
            unknown.append(f"{_join(path, key)}: unknown field ({_hint(key, list(by_key))})")
    kwargs: dict[str, Any] = {}
    for key, f in by_key.items():
        raw = value.get(key)
        if raw is not None:
            kwargs[f.name] = _convert(f.metadata, raw, _join(path, key), problems, unknown)
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{_join(path, key)}: required field is missing")
    if len(problems) > start:
        return None
    built = cls(**kwargs)
    finish = _FINISH.get(cls)
    return finish(built, path, problems) if finish else built


def _hint(key: object, accepted: list[str]) -> str:
    """Where an unknown key belongs when it is a key of another section (e.g. `flags.renameByDefault`,
    NVIDIA issue #1433), else the closest accepted key, else the accepted keys."""
    places = _places().get(str(key))
    if places:
        where = " or ".join(f"under {p}" if p else "at the top level" for p in places)
        return f"{key} belongs {where}"
    import difflib  # here, not at the top: 0.24 MiB the plugin process need not carry

    close = difflib.get_close_matches(str(key), accepted, n=1)
    return f"did you mean {close[0]}?" if close else f"accepted: {', '.join(accepted)}"


@cache
def _places() -> dict[str, list[str]]:
    """Every file key -> the sections it is a key of (`[]`: in each item of a list)."""
    places: dict[str, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        for f in fields(cls):
            key = f.metadata.get("key")
            if key is None:
                continue
            places.setdefault(key, []).append(path)
            inner = _join(path, key)
            if f.metadata["section"] is not None:
                walk(f.metadata["section"], inner)
            elif f.metadata["items"] is not None:
                walk(f.metadata["items"], inner + "[]")

    walk(Config, "")
    return places


def _convert(
    meta: Mapping[str, Any], raw: object, path: str, problems: list[str], unknown: list[str]
) -> object:
    if meta["section"] is not None:
        return _build(meta["section"], raw, path, problems, unknown)
    if meta["items"] is not None:
        if not isinstance(raw, list):
            problems.append(f"{path}: must be a list, got {show(raw)}")
            return None
        return tuple(
            _build(meta["items"], item, f"{path}[{i}]", problems, unknown) for i, item in enumerate(raw)
        )
    try:
        return meta["convert"](raw)
    except InvalidValue as error:
        problems.extend(f"{path}{suffix}: {message}" for suffix, message in error.problems)
        return None


# ---- rules that span fields ----------------------------------------------------------------------


def _finish_replicated(section: ReplicatedResources, path: str, problems: list[str]) -> ReplicatedResources:
    if not section.resources:
        problems.append(f"{path}.resources: must list at least one resource")
    by_name: dict[str, _Earlier] = {}
    for j, resource in enumerate(section.resources):
        earlier = by_name.setdefault(resource.name, _Earlier())
        i = earlier.first_overlap(resource.devices)
        if i is not None:
            overlap = _overlap(section.resources[i].devices, resource.devices)
            problems.append(
                f"{path}.resources[{j}].devices: overlaps resources[{i}] of the same name "
                f"{resource.name} on {overlap}; entries with the same name need disjoint devices"
            )
        earlier.add(j, resource.devices)
    if not section.rename_by_default:
        return section
    return replace(
        section,
        resources=tuple(
            r if r.rename else replace(r, rename=r.name + SHARED_SUFFIX) for r in section.resources
        ),
    )


@dataclass
class _Earlier:
    """The earlier entries of one resource name, indexed so that each new entry finds the first one
    it overlaps in time linear in its own devices (a file may hold 100,000 entries)."""

    first: int | None = None  # the first entry of all
    first_all: int | None = None  # the first `devices: all`
    first_count: int | None = None  # the first `devices: N`
    by_ref: dict[object, int] = field(default_factory=dict)  # a device reference -> its first entry

    def first_overlap(self, devices: object) -> int | None:
        """The lowest index of an earlier entry whose devices certainly share one with `devices`."""
        found = [self.first_all]
        if devices == "all":
            found.append(self.first)
        elif isinstance(devices, int):
            found.append(self.first_count)
        elif isinstance(devices, tuple):
            found.extend(self.by_ref.get(ref) for ref in devices)
        return min((i for i in found if i is not None), default=None)

    def add(self, index: int, devices: object) -> None:
        self.first = index if self.first is None else self.first
        if devices == "all" and self.first_all is None:
            self.first_all = index
        elif isinstance(devices, int) and self.first_count is None:
            self.first_count = index
        elif isinstance(devices, tuple):
            for ref in devices:
                self.by_ref.setdefault(ref, index)


def _overlap(a: object, b: object) -> str | None:
    """Devices two selections of one resource certainly share, in words; None when they may be
    disjoint (indices against UUIDs, or a count against a list, are checked on the node)."""
    if a == "all" or b == "all":
        return 'every device ("all")'
    if isinstance(a, int) and isinstance(b, int):
        return f"the first {min(a, b)} device{'s' if min(a, b) > 1 else ''} (both are counts)"
    if isinstance(a, tuple) and isinstance(b, tuple):
        common = [ref for ref in b if ref in a]
        if common:
            return f"devices {', '.join(dict.fromkeys(common))}"
    return None


def _finish_sharing(sharing: Sharing, path: str, problems: list[str]) -> Sharing:
    ts, mps = sharing.time_slicing, sharing.mps
    if ts is not None and mps is not None:
        problems.append(f"{path}: timeSlicing and mps are mutually exclusive; configure only one")
    if ts is not None:
        ts = _stamped(ts, TIME_SLICING, fail_by_default=False)
    if mps is not None:
        mps = _stamped(mps, MPS, fail_by_default=True)
    return replace(sharing, time_slicing=ts, mps=mps)


def _stamped(section: ReplicatedResources, strategy: str, *, fail_by_default: bool) -> ReplicatedResources:
    """The section with `failRequestsGreaterThanOne` resolved (unset: NVIDIA's default for the
    strategy), and its entries carrying it and the strategy."""
    fail = (
        fail_by_default
        if section.fail_requests_greater_than_one is None
        else section.fail_requests_greater_than_one
    )
    entries = tuple(
        replace(r, strategy=strategy, fail_requests_greater_than_one=fail) for r in section.resources
    )
    return replace(section, fail_requests_greater_than_one=fail, resources=entries)


def _finish_health(health: Health, path: str, problems: list[str]) -> Health:
    for xid in sorted(set(health.ignored_xids) & set(health.fatal_xids or ())):
        problems.append(f"{path}: XID {xid} is in both ignoredXids and fatalXids")
    return health


_FINISH: dict[type, Callable[[Any, str, list[str]], Any]] = {
    ReplicatedResources: _finish_replicated,
    Sharing: _finish_sharing,
    Health: _finish_health,
}
