"""Reading and validating a v1 config file (YAML or JSON), as NVIDIA's plugin reads it.

- The walk follows `nvdp.config.model`'s field metadata; each problem is one line naming the field
  path, all in one `ConfigError` (MAX_PROBLEMS, then a count). `null` means unset.
- An empty file, or one without `version`, is v1 with defaults.
- An unknown key is a WARNING with a "did you mean" hint; `strict=True` (`--strict-config`,
  `nvdp config check`) makes it an error. Refused unlike NVIDIA: duplicate keys, time-slicing + MPS.
- Keys match in any case where NVIDIA's does (Go's encoding/json) and in nvdp's sections, recorded
  in `recased_keys`; `_EXACT_CASE` sections take exact keys; two spellings are refused.
- Only a regular file of at most 1 MiB is read (`nvdp.base.files.read_bounded`); a mapping with no
  config key at top level is refused quoting none of it; quoted values are cut short (`values.show`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nvdp.base.errors import ConfigError, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.logs import log_event
from nvdp.config.decode import MAX_TEXT_BYTES, decode, syntax_problem
from nvdp.config.model import (
    MPS,
    SHARED_SUFFIX,
    TIME_SLICING,
    Config,
    Health,
    NamePattern,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
)
from nvdp.config.values import InvalidValue, describe_keys, show

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
        data = decode(text)
    except ValueError as error:
        raise ConfigError(syntax_problem(error), source=source) from error
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
    if data and not any(_fold(key) in _TOP_LEVEL_FOLDED for key in data):
        raise ConfigError(
            f"not an nvdp/NVIDIA device plugin config: no known top-level key ({describe_keys(list(data))};"
            f" known: {', '.join(_TOP_LEVEL_KEYS)})",
            source=source,
        )
    walk = _Walk(strict)
    config = _build(Config, data, "", walk)
    if walk.problems or config is None:  # a mis-cased key may be why (`Resources`: no resources)
        problems = [*walk.problems, *walk.lenient_miscased]
        raise ConfigError(_at_most(MAX_PROBLEMS, problems, "problems"), source=source)
    prefix = f"{source}: " if source else ""
    # Lenient: one line each, and the plugin runs.
    for line in _at_most(MAX_PROBLEMS, [*walk.unknown, *walk.miscased], "unknown fields"):
        log_event(log, logging.WARNING, f"{prefix}{line}; ignored (--strict-config refuses it)")
    return replace(config, recased_keys=tuple(walk.recased)) if walk.recased else config


MAX_PROBLEMS = 100  # lines reported for one file; a generated file may hold thousands of mistakes


def _at_most(limit: int, lines: list[str], what: str) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"and {len(lines) - limit} more {what}"]


_TOP_LEVEL_KEYS = tuple(f.metadata["key"] for f in fields(Config) if "key" in f.metadata)
# Go's encoding/json folds a key's letters to upper case, a non-ASCII one as ToUpper(ToLower(r)): the
# ASCII letters in any case, and these four non-ASCII letters, fold onto the ASCII keys of the schema.
_GO_FOLDS_ONTO_ASCII = str.maketrans({"\u212a": "k", "\u0130": "i", "\u0131": "i", "\u017f": "s"})


def _fold(key: object) -> object:
    """A key as Go's encoding/json compares it with the schema's (ASCII) keys: case folded."""
    return key.translate(_GO_FOLDS_ONTO_ASCII).lower() if isinstance(key, str) else key


_TOP_LEVEL_FOLDED = frozenset(_fold(key) for key in _TOP_LEVEL_KEYS)


# ---- the walk ----------------------------------------------------------------------------------


def _join(path: str, key: object) -> str:
    name = key if isinstance(key, str) and re.fullmatch(r"[\w.-]+", key) else show(key)
    return f"{path}.{name}" if path else name


@dataclass
class _Walk:
    """What the walk found: problems, unknown keys (problems too when strict), keys read in another
    letter case (the key's path as written, its path as the schema spells it)."""

    strict: bool
    problems: list[str] = field(default_factory=list)
    lenient_unknown: list[str] = field(default_factory=list)
    lenient_miscased: list[str] = field(default_factory=list)  # in the sections of exact keys
    recased: list[tuple[str, str]] = field(default_factory=list)

    @property
    def unknown(self) -> list[str]:
        return self.problems if self.strict else self.lenient_unknown

    @property
    def miscased(self) -> list[str]:
        return self.problems if self.strict else self.lenient_miscased


def _build(cls: type[T], value: object, path: str, walk: _Walk) -> T | None:
    """Build `cls` from a mapping, adding a line to `walk.problems` for each problem; None if any."""
    problems = walk.problems
    if not isinstance(value, Mapping):
        problems.append(f"{path}: must be a mapping, got {show(value)}")
        return None
    start = len(problems)
    by_key = {f.metadata["key"]: f for f in fields(cls) if "key" in f.metadata}
    written = _match_keys(value, by_key, path, walk, exact=cls in _EXACT_CASE)
    kwargs: dict[str, Any] = {}
    for key, f in by_key.items():
        raw = value[written[key]] if key in written else None
        if raw is not None:
            kwargs[f.name] = _convert(f.metadata, raw, _join(path, key), walk)
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{_join(path, key)}: required field is missing")
    if len(problems) > start:
        return None
    built = cls(**kwargs)
    finish = _FINISH.get(cls)
    return finish(built, path, problems) if finish else built


def _match_keys(
    value: Mapping[Any, Any], by_key: Mapping[str, object], path: str, walk: _Walk, *, exact: bool
) -> dict[str, Any]:
    """Each schema key of `value` -> the key as written: the same spelling, else (unless `exact`) the
    same but for letter case (recorded in `walk.recased`). Unknown keys and two spellings of one key
    are reported."""
    folded = {_fold(key): key for key in by_key}
    written: dict[str, Any] = {key: key for key in by_key if key in value}
    for key in value:
        if key in by_key:
            continue
        canonical = folded.get(_fold(key))
        if canonical is None:
            walk.unknown.append(f"{_join(path, key)}: unknown field ({_hint(key, list(by_key))})")
        elif exact:
            walk.miscased.append(
                f"{_join(path, key)}: unknown field (did you mean {canonical}? {EXACT_CASE})"
            )
        elif canonical in written:
            walk.problems.append(
                f"{_join(path, canonical)}: given twice, as {written[canonical]} and {key} (keys match in any"
                " letter case, as in NVIDIA's plugin); keep one"
            )
        else:
            written[canonical] = key
            walk.recased.append((_join(path, key), _join(path, canonical)))
    return written


def _hint(key: object, accepted: list[str]) -> str:
    """Where an unknown key belongs when it is a key of another section (e.g. `flags.renameByDefault`,
    NVIDIA issue #1433), else the closest accepted key, else the accepted keys."""
    places = _places().get(_fold(key))
    if places:
        where = " or ".join(f"under {p}" if p else "at the top level" for p in places)
        return f"{key} belongs {where}"
    import difflib  # here, not at the top: 0.24 MiB the plugin process need not carry

    close = difflib.get_close_matches(str(key), accepted, n=1)
    return f"did you mean {close[0]}?" if close else f"accepted: {', '.join(accepted)}"


@cache
def _places() -> dict[object, list[str]]:
    """Every file key, case folded -> the sections it is a key of (`[]`: in each item of a list)."""
    places: dict[object, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        for f in fields(cls):
            key = f.metadata.get("key")
            if key is None:
                continue
            places.setdefault(_fold(key), []).append(path)
            inner = _join(path, key)
            if f.metadata["section"] is not None:
                walk(f.metadata["section"], inner)
            elif f.metadata["items"] is not None:
                walk(f.metadata["items"], inner + "[]")

    walk(Config, "")
    return places


def _convert(meta: Mapping[str, Any], raw: object, path: str, walk: _Walk) -> object:
    if meta["section"] is not None:
        return _build(meta["section"], raw, path, walk)
    if meta["items"] is not None:
        if not isinstance(raw, list):
            walk.problems.append(f"{path}: must be a list, got {show(raw)}")
            return None
        return tuple(_build(meta["items"], item, f"{path}[{i}]", walk) for i, item in enumerate(raw))
    try:
        return meta["convert"](raw)
    except InvalidValue as error:
        walk.problems.extend(f"{path}{suffix}: {message}" for suffix, message in error.problems)
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


# NVIDIA's plugin decodes these with UnmarshalJSON methods of its own that look their keys up in a
# map, in their exact case: `sharing.timeSlicing` / `sharing.mps`, their resources, and the
# `resources.gpus` / `resources.mig` entries (a mis-cased optional key is ignored there, a required
# one refuses the file).
_EXACT_CASE = (ReplicatedResources, ReplicatedResource, NamePattern)
EXACT_CASE = "NVIDIA's plugin reads the keys of this section in their exact case"

_FINISH: dict[type, Callable[[Any, str, list[str]], Any]] = {
    ReplicatedResources: _finish_replicated,
    Sharing: _finish_sharing,
    Health: _finish_health,
}
