"""A config file's text decoded into plain data, within bounds: at most 1 MiB, integers of at most 40
digits, no duplicate keys (JSON or YAML), nesting and YAML aliases bounded (`nvdp.base.bounded`). A refusal
is said in one line (`syntax_problem`), cut short: a parser's message may quote the file."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from typing import Any

from nvdp.base.bounded import loads_json, loads_yaml
from nvdp.base.files import MAX_FILE_BYTES
from nvdp.base.units import describe_size
from nvdp.config.values import show

MAX_TEXT_BYTES = MAX_FILE_BYTES  # a ConfigMap holds at most 1 MiB
_MAX_PROBLEM_CHARS = 120  # a parser's message can quote the input: cut it short
_MAX_DIGITS = 40  # any integer a config needs fits; longer ones are refused before int() sees them


@cache
def _yaml_loader() -> Any:
    """The YAML loader, made on the first YAML text (a plugin without a config file never imports
    yaml): the pure-Python SafeLoader (the C one crashes on absurdly nested input; `nvdp.base.bounded`
    refuses it first), refusing duplicate keys and absurdly long integers."""
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


def decode(text: str) -> object:
    """The data of a config's text: JSON when it starts with `{` and parses as JSON, else YAML. Raises
    ValueError on text that is neither, too large, or out of bounds."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ValueError(f"larger than {describe_size(MAX_TEXT_BYTES)}")
    if text.lstrip().startswith("{"):
        try:
            return loads_json(
                text, max_bytes=MAX_TEXT_BYTES, object_pairs_hook=_json_object, parse_int=_json_int
            )
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; YAML's error message will tell
    import yaml

    try:
        return loads_yaml(text, max_bytes=MAX_TEXT_BYTES, loader=_yaml_loader())  # a SafeLoader subclass
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


def syntax_problem(error: BaseException) -> str:
    """The one line that says why `decode` refused a text."""
    if isinstance(error, _YamlSyntax):
        return str(error)
    return "invalid config: " + _clip(str(error))


def _clip(message: str) -> str:
    """A parser's message on one line and cut short (it may quote the file, e.g. an alias name)."""
    words = " ".join(message.split())
    return words if len(words) <= _MAX_PROBLEM_CHARS else words[: _MAX_PROBLEM_CHARS - 3] + "..."
