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
    """A driver root (= dev root) with the driver's libraries (plus `.so.1` SONAME symlinks, `.so`
    symlinks for two of them, a library of another version, a library reached through a symlink,
    NVIDIA's legacy NVVM library and a GL library behind two symlinks), binaries, firmware,
    nvidia-persistenced's socket, the control nodes and every device node the GPUs need. Device
    nodes are character devices (mode 0666, numbers as the driver gives them: `device_numbers`)
    when mknod is permitted, else empty files. Returns whether mknod worked."""
    lib = root / LIB_DIR
    lib.mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        path = lib / f"{name}.so.{DRIVER_VERSION}"
        path.write_bytes(b"\x7fELF fake " + name.encode())
        (lib / f"{name}.so.1").symlink_to(path.name)
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (lib / "libnvidia-ml.so").symlink_to("libnvidia-ml.so.1")
    (lib / "libnvidia-nvvm70.so.4").write_bytes(b"\x7fELF legacy nvvm")
    (lib / "libEGL.so.1.1.0").write_bytes(b"\x7fELF glvnd")
    (lib / "libEGL.so.1").symlink_to("libEGL.so.1.1.0")
    (lib / "libEGL.so").symlink_to("libEGL.so.1")
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
    socket = root / "run/nvidia-persistenced/socket"
    socket.parent.mkdir(parents=True)
    socket.touch()  # a socket to the spec, which only checks that it is no directory
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *extra_nodes]
    for gpu in gpus:
        nodes += gpu_device(gpu).paths
        for mig in gpu.mig_devices:
            nodes += mig_device(gpu, mig, mig_minors).paths
    mknod_ok = True
    for node in dict.fromkeys(nodes):
        mknod_ok = make_char_device(root / node.lstrip("/")) and mknod_ok
    return mknod_ok


def device_numbers(path: str) -> tuple[int, int]:
    """(major, minor) of a device node as a host gives them: 195 for the GPUs and nvidiactl, and
    dynamic majors (here 510, 511, 512, 513) for nvidia-uvm, the caps, IMEX channels and the rest."""
    name = os.path.basename(path)
    fixed = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254), "nvidia-uvm": (510, 0)}
    if name in fixed:
        return fixed[name]
    if name == "nvidia-uvm-tools":
        return 510, 1
    number = int(re.sub(r"\D", "", name) or 0)
    if re.fullmatch(r"nvidia\d+", name):
        return 195, number
    return (511 if name.startswith("nvidia-cap") else 512 if name.startswith("channel") else 513), number


def make_char_device(path: Path, mode: int = 0o666) -> bool:
    """A character device at `path` (numbers by its name: `device_numbers`; `mode` whatever the
    umask), or an empty file where mknod is not permitted; False then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return True
    try:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(*device_numbers(str(path))))
    except (PermissionError, OSError):
        path.touch()
        return False
    os.chmod(path, mode)
    return True


DEVICE_FIELDS = ("major", "minor", "fileMode", "permissions", "gid")


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
