"""Reading and validating a v1 config file (YAML or JSON), as NVIDIA's plugin reads it.

The walk is driven by the dataclass field metadata in `nvdp.config.model`: unknown keys, wrong
types and invalid values each add one line naming the field path, and every problem is reported
at once in one `ConfigError`. `null` means "not set". Like NVIDIA's plugin, an empty file and a
file without `version` are v1 with defaults. Unknown keys are lenient by default, the Kubernetes
way: each one is a WARNING line (with a "did you mean" hint) and the file loads, so a file written
for a newer NVIDIA release still runs; `strict=True` (`--strict-config`, `nvdp config check`) makes
them errors. Unlike NVIDIA's plugin, duplicate keys and sharing with both time-slicing and MPS are
refused instead of silently ignored.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from nvdp.config.model import SHARED_SUFFIX, Config, Health, ReplicatedResources, Sharing
from nvdp.config.values import InvalidValue, show
from nvdp.errors import ConfigError
from nvdp.logs import log_event

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

log = logging.getLogger(__name__)


def load_file(path: str | Path, *, strict: bool = False) -> Config:
    """Read and validate a config file. Raises ConfigError (source = the path) on any problem;
    unknown keys are problems only when `strict`, else one WARNING line each."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read config file: {error.strerror or error}", source=str(path)) from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file is not UTF-8 text (byte {error.start})", source=str(path)) from error
    return parse_text(text, source=str(path), strict=strict)


def parse_text(text: str, source: str | None = None, *, strict: bool = False) -> Config:
    """Parse YAML or JSON text (JSON is tried first when the text starts with `{`)."""
    try:
        data = _decode(text)
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise ConfigError(_syntax_problem(error), source=source) from error
    return parse(data, source, strict=strict)


def parse(data: object, source: str | None = None, *, strict: bool = False) -> Config:
    """Validate decoded file content (a mapping; None is an empty file) into a Config."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the config must be a mapping (version, flags, resources, ...), got {show(data)}", source=source
        )
    problems: list[str] = []
    unknown: list[str] = problems if strict else []
    config = _build(Config, data, "", problems, unknown)
    if problems or config is None:
        raise ConfigError(problems, source=source)
    prefix = f"{source}: " if source else ""
    for line in unknown:  # lenient: one line each, the plugin runs
        log_event(log, logging.WARNING, f"{prefix}{line}; ignored (--strict-config refuses it)")
    return config


# ---- decoding ----------------------------------------------------------------------------------

MAX_TEXT_BYTES = 1 << 20  # a ConfigMap holds at most 1 MiB
_MAX_DIGITS = 40  # any integer a config needs fits; longer ones are refused before int() sees them

# The pure-Python SafeLoader: on absurdly nested input it raises RecursionError where the C one crashes.
_Loader: Any = type("_Loader", (yaml.SafeLoader,), {})


def _mapping_without_duplicates(loader: Any, node: Any) -> Any:
    counts = Counter(key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode))
    duplicate = next((key for key, n in counts.items() if n > 1), None)
    if duplicate is not None:
        raise yaml.constructor.ConstructorError(
            None, None, f"duplicate key {show(duplicate)}", node.start_mark
        )
    return loader.construct_mapping(node)


def _bounded_int(loader: Any, node: Any) -> Any:
    if len(node.value) > _MAX_DIGITS:
        raise yaml.constructor.ConstructorError(None, None, "number too large", node.start_mark)
    return loader.construct_yaml_int(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_Loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


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
        raise ValueError(f"larger than {MAX_TEXT_BYTES} bytes")
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int)
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; YAML's error message will tell
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: plain data only


def _syntax_problem(error: BaseException) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    if isinstance(error, RecursionError):
        return "invalid config: nested too deeply"
    return "invalid config: " + " ".join(str(error).split())


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
            import difflib  # here, not at the top: 0.24 MiB the plugin process need not carry

            close = difflib.get_close_matches(str(key), list(by_key), n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (accepted: {', '.join(by_key)})"
            unknown.append(f"{_join(path, key)}: unknown field{hint}")
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
    for j, resource in enumerate(section.resources):
        for i, earlier in enumerate(section.resources[:j]):
            if earlier.name == resource.name:
                overlap = _overlap(earlier.devices, resource.devices)
                if overlap:
                    problems.append(
                        f"{path}.resources[{j}].devices: overlaps resources[{i}] of the same name "
                        f"{resource.name} on {overlap}; entries with the same name need disjoint devices"
                    )
    if not section.rename_by_default:
        return section
    return replace(
        section,
        resources=tuple(
            r if r.rename else replace(r, rename=r.name + SHARED_SUFFIX) for r in section.resources
        ),
    )


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
    if ts is not None and ts.fail_requests_greater_than_one is None:
        ts = replace(ts, fail_requests_greater_than_one=False)
    if mps is not None and mps.fail_requests_greater_than_one is None:
        mps = replace(mps, fail_requests_greater_than_one=True)
    return replace(sharing, time_slicing=ts, mps=mps)


def _finish_health(health: Health, path: str, problems: list[str]) -> Health:
    for xid in sorted(set(health.ignored_xids) & set(health.fatal_xids or ())):
        problems.append(f"{path}: XID {xid} is in both ignoredXids and fatalXids")
    return health


_FINISH: dict[type, Callable[[Any, str, list[str]], Any]] = {
    ReplicatedResources: _finish_replicated,
    Sharing: _finish_sharing,
    Health: _finish_health,
}
