"""Bounded JSON and YAML parsing: a document too large or nested too deep is refused in one line.

Python's parsers recurse per nesting level; their RecursionError would end the reading thread.
- `loads_json` refuses text over `max_bytes`, or whose brackets (outside strings) nest deeper than
  `max_depth`, by a C-speed scan before `json.loads` (about 50 ms a MiB of brackets).
- `loads_yaml` refuses text over `max_bytes`, a node deeper than `max_depth`, an alias inside its
  own anchor, and aliases standing for over `max_bytes // 2` nodes in all ("billion laughs").
- Both raise `BoundExceeded`, a ValueError, so a reader's "unreadable" line or ConfigError covers
  it; syntax errors stay the parser's own (`json.JSONDecodeError`, `yaml.YAMLError`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from itertools import accumulate
from typing import Any

from nvdp.base.units import MIB, describe_size

MAX_BYTES = MIB  # a ConfigMap holds at most 1 MiB; no file nvdp reads needs more
MAX_DEPTH = 100  # the deepest document nvdp reads (an API object's managedFields) nests about 12 levels

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')  # unterminated: to the end
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class BoundExceeded(ValueError):
    """A document larger, nested deeper or (YAML) expanding further than its reader allows; one line."""


def loads_json(
    text: str | bytes,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    parse_int: Callable[[str], Any] | None = None,
) -> Any:
    """`json.loads(text)` of UTF-8 text of at most `max_bytes` bytes nested at most `max_depth` levels.
    Raises BoundExceeded, json.JSONDecodeError, or UnicodeDecodeError (bytes that are no UTF-8)."""
    _check_size("JSON", text, max_bytes)
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    depth = json_depth(text, max_depth)
    if depth > max_depth:
        raise BoundExceeded(f"JSON nested deeper than {max_depth} levels")
    return json.loads(text, object_pairs_hook=object_pairs_hook, parse_int=parse_int)


def json_depth(text: str, at_most: int = 0) -> int:
    """How deep the brackets of JSON `text` nest outside its strings (0 for a scalar); `at_most`: when
    the text holds no more brackets than that, their count (an upper bound) is answered unscanned."""
    opening = text.count("[") + text.count("{")
    if opening <= at_most:
        return opening
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads_yaml(
    text: str | bytes, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, loader: Any = None
) -> Any:
    """`yaml.load(text, Loader=loader)` (default: `yaml.SafeLoader`, plain data only) of at most
    `max_bytes` bytes, its nodes nested at most `max_depth` levels, its aliases standing for at most
    `max_bytes // 2` nodes in all. Raises BoundExceeded, or yaml.YAMLError for what is no YAML."""
    _check_size("YAML", text, max_bytes)
    import yaml  # here: a process that reads no YAML never imports it

    bounded = _bounded_loader(loader or yaml.SafeLoader)(text)
    bounded.bounds = (max_depth, max(max_bytes // 2, 1))
    try:
        return bounded.get_single_data()
    finally:
        bounded.dispose()


def _check_size(kind: str, text: str | bytes, max_bytes: int) -> None:
    size = (
        len(text)
        if isinstance(text, bytes) or len(text) * 4 <= max_bytes
        else len(text.encode("utf-8", "surrogatepass"))
    )
    if size > max_bytes:
        raise BoundExceeded(f"{kind} larger than {describe_size(max_bytes)}")


@cache
def _bounded_loader(base: Any) -> Any:
    """`base` (a yaml Loader class) with a composer that keeps the bounds (see the module)."""
    import yaml

    class Bounded(base):  # type: ignore[misc]
        bounds = (MAX_DEPTH, MAX_BYTES // 2)

        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._depth = 0
            self._nodes = 0  # nodes composed so far, each alias counting as the nodes it stands for
            self._aliased = 0  # the nodes the aliases stand for
            self._weights: dict[str, int] = {}  # anchor -> the nodes its node stands for

        def compose_document(self) -> Any:
            self._depth, self._nodes, self._aliased, self._weights = 0, 0, 0, {}
            return super().compose_document()

        def compose_node(self, parent: Any, index: Any) -> Any:
            max_depth, max_aliased = self.bounds
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                node = super().compose_node(parent, index)  # an undefined alias: the composer's error
                weight = self._weights.get(event.anchor)
                if weight is None:
                    raise BoundExceeded(
                        f"YAML alias *{_clip(event.anchor)} inside its own anchor{_at(event)}"
                    )
                self._nodes += weight
                self._aliased += weight
                if self._aliased > max_aliased:
                    raise BoundExceeded(f"YAML aliases stand for more than {max_aliased} nodes{_at(event)}")
                return node
            if self._depth >= max_depth:
                raise BoundExceeded(f"YAML nested deeper than {max_depth} levels{_at(event)}")
            before = self._nodes
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            self._nodes += 1
            if event.anchor is not None:
                self._weights[event.anchor] = self._nodes - before
            return node

    return Bounded


def _at(event: Any) -> str:
    mark = event.start_mark
    return f" at line {mark.line + 1}, column {mark.column + 1}"


def _clip(anchor: str) -> str:
    return anchor if len(anchor) <= 40 else anchor[:37] + "..."
