"""Test helpers for CDI: the fake driver root (`testkit.driver_root`) and a small JSON-schema
validator.

The validator covers the subset of draft-07 the CDI schema uses (type, properties, required, items,
$ref to local definitions, minimum, maximum, patternProperties, additionalProperties); any other
keyword makes it fail loudly, so the subset cannot silently grow. `strict` also refuses properties
the schema does not name, which the published schema allows but nvdp never means to write.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from testkit.driver_root import (
    DRIVER_VERSION,
    LIB_DIR,
    LIBRARIES,
    device_numbers,
    make_char_device,
    make_node,
)

__all__ = [
    "DRIVER_VERSION",
    "LIB_DIR",
    "LIBRARIES",
    "assert_valid",
    "device_numbers",
    "load_schema",
    "make_char_device",
    "make_node",
    "strict_schema",
    "validate",
    "without_device_fields",
]

SCHEMA = Path(__file__).parent / "data" / "cdi" / "schema-0.5.0.json"
DEVICE_FIELDS = ("major", "minor", "fileMode", "permissions", "gid")
_IGNORED = {"description", "$schema", "$comment", "ref"}  # "ref": a typo in the published defs.json


def without_device_fields(spec: Any) -> Any:
    """`spec` with the fields stat gives device nodes removed: what the spec is where the fake root's
    nodes are plain files (no mknod)."""
    if isinstance(spec, dict):
        return {
            k: without_device_fields(v)
            for k, v in spec.items()
            if not (k in DEVICE_FIELDS and "path" in spec and "hostPath" in spec)
        }
    if isinstance(spec, list):
        return [without_device_fields(v) for v in spec]
    return spec


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The CDI library's MinimumRequiredVersion (specs-go/version.go): 0.4.0 for a mount `type`,
    0.5.0 for a device node `hostPath` or a device name that starts with no letter, 0.6.0 for
    annotations or a dot in the class, 0.7.0 for `intelRdt` or `additionalGids`; else 0.3.0."""
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
    if any("intelRdt" in e or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]):
        return "0.6.0"
    if "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    digit_names = any(not d["name"][:1].isalpha() for d in spec["devices"])
    if digit_names or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def load_schema() -> dict[str, Any]:
    schema = json.loads(SCHEMA.read_text())
    assert isinstance(schema, dict)
    return schema


def validate(instance: object, schema: dict[str, Any], *, strict: bool = True) -> list[str]:
    """Every violation of `schema` in `instance`, as `path: problem` lines."""
    problems: list[str] = []
    _check(instance, schema, schema, "$", strict, problems)
    return problems


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}
_KNOWN = {
    "type",
    "properties",
    "required",
    "items",
    "$ref",
    "minimum",
    "maximum",
    "patternProperties",
    "additionalProperties",
    "definitions",
}


def _check(
    value: object, schema: dict[str, Any], root: dict[str, Any], at: str, strict: bool, out: list[str]
) -> None:
    unknown = set(schema) - _KNOWN - _IGNORED
    if unknown:
        raise AssertionError(f"{at}: schema keyword(s) outside the validator's subset: {sorted(unknown)}")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise AssertionError(f"{at}: non-local $ref {ref}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        _check(value, target, root, at, strict, out)
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _TYPES[kind]) and not (kind == "integer" and isinstance(value, bool))
        if not ok:
            out.append(f"{at}: expected {kind}, got {type(value).__name__}")
            return
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{at}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{at}: {value} > maximum {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"{at}: missing required {name!r}")
        for key, item in value.items():
            matched = False
            if key in properties:
                matched = True
                _check(item, properties[key], root, f"{at}.{key}", strict, out)
            for pattern, sub in patterns.items():
                if re.search(pattern, key):
                    matched = True
                    _check(item, sub, root, f"{at}.{key}", strict, out)
            if not matched and (schema.get("additionalProperties") is False or (strict and properties)):
                out.append(f"{at}: unexpected property {key!r}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{at}[{i}]", strict, out)


def assert_valid(spec: dict[str, Any], name: str = "") -> None:
    """Valid against the published schema (and strictly, against what CDI's Go types define), at the
    lowest cdiVersion that can express it."""
    assert validate(spec, load_schema(), strict=False) == [], name
    assert validate(spec, strict_schema()) == [], name
    assert spec["cdiVersion"] == minimum_cdi_version(spec), name


def strict_schema() -> dict[str, Any]:
    """The published schema plus what CDI's Go types (specs-go/config.go) define and the schema file
    leaves unnamed, which strict validation would otherwise refuse: the spec-level `containerEdits`,
    a device node's `fileMode` (since 0.3.0, an os.FileMode) and `additionalGids` (0.7.0)."""
    schema = load_schema()
    schema["properties"]["containerEdits"] = {"$ref": "#/definitions/containerEdits"}
    definitions = schema["definitions"]
    definitions["DeviceNode"]["properties"]["fileMode"] = {"$ref": "#/definitions/uint32"}
    definitions["containerEdits"]["properties"]["additionalGids"] = {
        "type": "array",
        "items": {"$ref": "#/definitions/uint32"},
    }
    return schema
