"""Arbitrary input never escapes as anything but a Config or a ConfigError."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdp.base.bounded import MAX_DEPTH
from nvdp.base.errors import ConfigError
from nvdp.config import Config, PluginOptions, parse, parse_text

DATA = Path(__file__).parent / "data" / "config"


def _keys(cls: type) -> set[str]:
    found: set[str] = set()
    for f in dataclasses.fields(cls):
        if "key" in f.metadata:
            found.add(f.metadata["key"])
            nested = f.metadata["section"] or f.metadata["items"]
            if nested is not None:
                found |= _keys(nested)
    return found


KEYS = sorted(_keys(Config))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["all", "v1", "none", "mixed", "gpu", "5m", "0:1", "envvar", "-1s"]),
    st.dates(),
    st.binary(max_size=5),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=10), st.integers(), st.none())
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=6)),
    max_leaves=40,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=6) | values


def _accepts(outcome: object) -> None:
    assert isinstance(outcome, Config)
    assert parse(outcome.to_dict()) == outcome
    PluginOptions(outcome).to_json()


@pytest.mark.parametrize(
    "seconds, kept", [(2.225073858507e-311, 0.0), (1.0000000004, 1.0), (0.1, 0.1), (7, 7.0)]
)
def test_a_duration_in_seconds_is_held_in_whole_nanoseconds_and_reads_back(
    seconds: float, kept: float
) -> None:
    config = parse({"health": {"recoveryQuietPeriod": seconds}})
    assert config.health.recovery_quiet_period == kept
    _accepts(config)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_parse_any_structure(data: object) -> None:
    try:
        _accepts(parse(data))
    except ConfigError as error:
        assert error.problems and all(isinstance(p, str) and "\n" not in p for p in error.problems)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_parse_text_of_any_yaml_document(data: object) -> None:
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return
    try:
        _accepts(parse_text(text))
    except ConfigError as error:
        assert error.problems


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200) | st.text(alphabet="{}[]:,-&*!|>'\"#%@`\n \t0123456789abv.", max_size=200))
def test_parse_text_of_any_text(text: str) -> None:
    try:
        _accepts(parse_text(text))
    except ConfigError as error:
        assert error.problems


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.integers(min_value=0, max_value=20_000), st.booleans())
def test_parse_text_of_any_document_nested_to_any_depth(inner: object, depth: int, as_json: bool) -> None:
    """Nesting past nvdp.base.bounded's limit is one line (it used to be RecursionError's territory)."""
    value = json.dumps(inner, default=str)
    nest = "[" * depth + value + "]" * depth
    text = f'{{"version": "v1", "flags": {nest}}}' if as_json else f"version: v1\nflags: {nest}\n"
    try:
        _accepts(parse_text(text))
    except ConfigError as error:
        assert error.problems and all("\n" not in p for p in error.problems)
        if depth > MAX_DEPTH:
            assert (
                error.problems[0].startswith("invalid config: ") and "nested deeper than" in error.problems[0]
            )


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, (*prefix, i))
    return found


def _with(value: object, path: tuple[object, ...], new: object) -> object:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _with(value[head], rest, new)}
    assert isinstance(value, list) and isinstance(head, int)
    return [*value[:head], _with(value[head], rest, new), *value[head + 1 :]]


EXAMPLE_FILES = ("full.yaml", "resources.yaml", "health.yaml", "mig-mixed.yaml", "time-slicing-rename.yaml")
EXAMPLES = [yaml.safe_load((DATA / name).read_text()) for name in EXAMPLE_FILES]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(EXAMPLES).flatmap(lambda doc: st.tuples(st.just(doc), st.sampled_from(_paths(doc)))),
    values,
)
def test_one_value_replaced_in_a_valid_file(case: tuple[object, tuple[object, ...]], new: object) -> None:
    document, path = case
    try:
        _accepts(parse(_with(document, path, new)))
    except ConfigError as error:
        assert error.problems
