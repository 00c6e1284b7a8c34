"""Test helpers for CDI: a fake driver root and a small JSON-schema validator.

The validator covers the subset of draft-07 the CDI schema uses (type, properties, required, items,
$ref to local definitions, minimum, maximum, patternProperties, additionalProperties); any other
keyword makes it fail loudly, so the subset cannot silently grow. `strict` also refuses properties
the schema does not name, which the published schema allows but nvdp never means to write.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nvdp.devices import gpu_device, mig_device
from nvdp.nvml.types import GpuInfo

DRIVER_VERSION = "550.54.15"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
LIBRARIES = ("libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler", "libcudadebugger", "libnvidia-allocator")
SCHEMA = Path(__file__).parent / "data" / "cdi" / "schema-0.5.0.json"
_IGNORED = {"description", "$schema", "$comment", "ref"}  # "ref": a typo in the published defs.json


def make_node(
    root: Path,
    gpus: Sequence[GpuInfo],
    *,
    extra_nodes: Iterable[str] = (),
    mig_minors: dict[str, int] | None = None,
) -> bool:
    """A driver root (= dev root) with the driver's libraries (plus `.so.1` symlinks, a library of
    another version, a library reached through a symlink), binaries, firmware, the control nodes
    and every device node the GPUs need. Device nodes are character devices when mknod is
    permitted, else empty files (spec generation only checks that a node exists). Returns whether
    mknod worked."""
    lib = root / LIB_DIR
    lib.mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        path = lib / f"{name}.so.{DRIVER_VERSION}"
        path.write_bytes(b"\x7fELF fake " + name.encode())
        (lib / f"{name}.so.1").symlink_to(path.name)
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (root / "lib64").symlink_to(LIB_DIR)  # merged /usr: the same libraries under a second name
    (lib / "libcuda.so.535.104.05").write_bytes(b"\x7fELF other version")
    real = root / "opt/nvidia/libnvidia-cfg.so.real"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"\x7fELF cfg")
    (lib / f"libnvidia-cfg.so.{DRIVER_VERSION}").symlink_to("/opt/nvidia/libnvidia-cfg.so.real")
    for binary in ("nvidia-smi", "nvidia-persistenced"):
        path = root / "usr/bin" / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"#!fake")
    firmware = root / "lib/firmware/nvidia" / DRIVER_VERSION / "gsp_ga10x.bin"
    firmware.parent.mkdir(parents=True)
    firmware.write_bytes(b"gsp")
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *extra_nodes]
    for gpu in gpus:
        nodes += gpu_device(gpu).paths
        for mig in gpu.mig_devices:
            nodes += mig_device(gpu, mig, mig_minors).paths
    mknod_ok = True
    for n, node in enumerate(dict.fromkeys(nodes)):
        mknod_ok = make_char_device(root / node.lstrip("/"), n) and mknod_ok
    return mknod_ok


def make_char_device(path: Path, minor: int) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return True
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        return True
    except (PermissionError, OSError):
        path.touch()
        return False


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
