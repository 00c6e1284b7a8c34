"""Scalar value checks shared by the config file, the command line and the environment.

Each converter takes a decoded YAML/JSON value and returns the typed value or raises `InvalidValue`
with a one-line message that does not name the field (the caller prefixes the field path, or the
`--flag / ENV` label). Text parsers (`parse_bool`, `split_list`) turn a flag or env string into the
value a converter accepts. Durations are Go's (`nvdp.base.units`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from nvdp.base import units

INT64_MAX = 2**63 - 1

Converter = Callable[[object], object]
T = TypeVar("T")


class InvalidValue(ValueError):
    """A value is refused. `problems` holds (path suffix, message) pairs, e.g. ("[1]", "...")."""

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        self.problems = list(problems) or [("", message)]
        super().__init__(message)


SHOWN_CHARS = 64  # the most characters of a string value a message quotes


def show(value: object) -> str:
    """A value as it appears in an error message: strings quoted (what cannot be printed escaped),
    containers named, and nothing longer than SHOWN_CHARS (a file given by mistake may be a secret:
    a message quotes a short piece of a value, never a long line of it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        inner = "".join(
            c if c.isprintable() else _escape(c) for c in json.dumps(value, ensure_ascii=False)[1:-1]
        )
        return f'"{inner}"' if len(inner) <= SHOWN_CHARS else f'"{inner[:SHOWN_CHARS]}..."'
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else "a very large number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple | set | frozenset):
        return "a list"
    return f"a value of type {type(value).__name__}"


_KEY_NAME = re.compile(r"[A-Za-z_][\w.-]{0,39}")  # what a field name could look like
_KEYS_SHOWN = 5


def describe_keys(keys: Sequence[object]) -> str:
    """The keys of a file that is not what it was meant to be, for a refusal line: "found: a, b and
    3 more". Quotes no key that does not look like a field name: the file may be a secret given by
    mistake (`/etc/shadow`), whose "keys" are whole lines of it."""
    names = [key for key in keys if isinstance(key, str) and _KEY_NAME.fullmatch(key)][:_KEYS_SHOWN]
    if not names:
        return f"found {len(keys)} key{'s' if len(keys) > 1 else ''}, none of them a field name"
    more = len(keys) - len(names)
    return f"found: {', '.join(names)}" + (f" and {more} more" if more else "")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def accepted(choices: Sequence[str]) -> str:
    return f"(accepted: {', '.join(choices)})"


def string(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"must be a string, got {show(value)}")
    return value


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue(f"must be true or false, got {show(value)}")
    return value


# Exactly what Go's strconv.ParseBool accepts (urfave/cli uses it for flags and env vars).
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """A boolean flag or env value. Empty means false, as with urfave/cli for a defined env var."""
    if text in _TRUE:
        return True
    if text in _FALSE or text == "":
        return False
    raise InvalidValue(f"invalid value {show(text)} (accepted: true, false, 1, 0)")


def split_list(text: str) -> list[str]:
    """A comma-separated flag or env value; blanks around items and empty items are dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def choice(*choices: str) -> Callable[[object], str]:
    def convert(value: object) -> str:
        text = string(value)
        if text not in choices:
            raise InvalidValue(f"invalid value {show(text)} {accepted(choices)}")
        return text

    return convert


def integer(minimum: int = 0, maximum: int = INT64_MAX) -> Callable[[object], int]:
    def convert(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum:
            return value
        bound = f">= {minimum}" if maximum == INT64_MAX else f"from {minimum} to {maximum}"
        raise InvalidValue(f"must be an integer {bound}, got {show(value)}")

    return convert


def list_of(
    item: Callable[[object], T], *, min_items: int = 0, single: bool = False
) -> Callable[[object], tuple[T, ...]]:
    """A list whose items pass `item`; every bad item is reported. `single`: a lone item is a list."""

    def convert(value: object) -> tuple[T, ...]:
        if single and not isinstance(value, list):
            value = [value]
        if not isinstance(value, list):
            raise InvalidValue(f"must be a list, got {show(value)}")
        if len(value) < min_items:
            raise InvalidValue(f"must list at least {min_items} value{'s' if min_items > 1 else ''}")
        out: list[T] = []
        problems: list[tuple[str, str]] = []
        for i, raw in enumerate(value):
            try:
                out.append(item(raw))
            except InvalidValue as error:
                problems += [(f"[{i}]{suffix}", message) for suffix, message in error.problems]
        if problems:
            raise InvalidValue(problems[0][1], problems)
        return tuple(out)

    return convert


# ---- durations ---------------------------------------------------------------------------------


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration ("1h30m", "300ms", "0"), in seconds (`nvdp.base.units`), within Go's range."""
    try:
        seconds = units.parse_go_duration(text)
    except ValueError:
        raise InvalidValue(f"invalid duration {show(text)}") from None
    if abs(seconds) > units.MAX_GO_DURATION_S:
        raise InvalidValue(f"out of range, got {show(text)}")
    return seconds


def duration(per_second: int = 1, *, positive: bool = False) -> Callable[[object], float]:
    """A Go duration string, or a plain number of 1/`per_second` seconds (1e9: nanoseconds, as Go
    reads a JSON number); in seconds, never negative (`positive`: never 0 either)."""

    def convert(value: object) -> float:
        if isinstance(value, str):
            seconds = parse_go_duration(value)
        elif isinstance(value, int | float) and not isinstance(value, bool) and not _is_nan(value):
            # int-float comparison is exact, never overflows
            if abs(value) > units.MAX_GO_DURATION_S * per_second:
                raise InvalidValue(f"out of range, got {show(value)}")
            # whole nanoseconds, as Go holds a Duration (so a value reads back as it was written)
            seconds = round(value * (10**9 // per_second)) / 10**9
        else:
            unit = "seconds" if per_second == 1 else "nanoseconds"
            raise InvalidValue(
                f'must be a duration such as "30s" or "5m", or a number of {unit}, got {show(value)}'
            )
        if seconds < 0 or (positive and seconds == 0):
            raise InvalidValue(f"must be {'>' if positive else '>='} 0, got {show(value)}")
        return seconds

    return convert


def _is_nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)
