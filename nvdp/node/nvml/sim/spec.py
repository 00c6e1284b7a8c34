"""Simulated node descriptions: the YAML node-file schema, its validation, the built-in profiles.

What a description becomes is a `nvdp.node.nvml.sim.node.SimNode`.

A node file is validated as a whole: every problem is reported at once, one line each, naming the
field (`gpus[1].memory_mib: ...`), as a `ConfigError`. Built-in profiles are node descriptions in
`nvdp.node.nvml.sim.profiles` and go through the same parser. The schema is documented in the README.
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

from nvdp.base.bounded import BoundExceeded, loads_yaml
from nvdp.base.errors import ConfigError, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.config.values import describe_keys
from nvdp.node.nvml.sim.fabric import parse_fabric
from nvdp.node.nvml.sim.mig import MigGeometry, MigLayoutError, place
from nvdp.node.nvml.sim.models import MODELS
from nvdp.node.nvml.sim.node import SimGpu, SimNode, derived_uuid
from nvdp.node.nvml.sim.profiles import PROFILES
from nvdp.node.nvml.types import PcieLevel

DEFAULT_DRIVER_VERSION = "550.54.15"
DEFAULT_CUDA_DRIVER_VERSION = "12.4"

_SHOWN_CHARS = 64  # the longest value or message piece quoted in a problem line
_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring = 2, 4, 4, _SHOWN_CHARS


def _quote(value: object) -> str:
    """A value in a problem line, as Python writes it, cut short (`reprlib`: a YAML alias bomb is
    never written out in full)."""
    return _clip(_REPR.repr(value))


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


_NODE_FIELDS = (
    "driver_version", "cuda_driver_version", "uuid_seed", "gpus", "nvswitch", "nvlinks", "pcie", "fabric",
)  # fmt: skip
_GPU_FIELDS = (
    "name", "count", "memory_mib", "compute_capability", "numa", "numa_nodes", "pci_bus_ids", "uuids",
    "minors", "ecc", "mig_capable", "mig_slices", "mig", "lost",
)  # fmt: skip
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_VERSION = re.compile(r"^\d+\.\d+$")


def _bus_id(bus_id: str) -> str | None:
    """NVML's form of a PCI bus id ("00000000:07:00.0"), or None when it is not one (strict, for node
    files; `nvdp.node.nvml.naming.normalize_bus_id` is the lenient one for what NVML answers)."""
    m = _BUS_ID.match(bus_id)
    if m is None:
        return None
    return f"{int(m[1], 16):08X}:{m[2].upper()}:{m[3].upper()}.{m[4]}"


def profile_names() -> list[str]:
    return sorted(PROFILES)


def load_profile(name: str) -> SimNode:
    """A built-in simulated node by name; ConfigError naming the accepted ones if there is none."""
    names = profile_names()
    if name not in names:
        raise ConfigError(
            f"--nvml sim:{name}: unknown simulated node profile {_quote(name)}; "
            f"accepted: {', '.join(names)}, or sim:/path/to/node.yaml"
        )
    return parse_node(PROFILES[name], name, f"profile {name}")


def load_node_file(path: str | Path) -> SimNode:
    """A simulated node from a YAML node file; ConfigError with every problem found."""
    p = Path(path)
    try:
        text = read_bounded(p).decode("utf-8")
    except UnreadableFile as e:
        raise ConfigError(f"cannot read simulated node file: {e.reason}", source=str(p)) from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"simulated node file is not UTF-8 text (byte {e.start})", source=str(p)) from e
    return parse_node(_load_yaml(text, str(p)), p.stem, str(p))


def _load_yaml(text: str, source: str) -> object:
    import yaml  # only for a node file: a built-in profile is Python data

    try:
        return loads_yaml(text)
    except BoundExceeded as e:
        raise ConfigError(str(e), source=source) from e
    except ValueError as e:  # an integer too long for int()
        raise ConfigError(f"invalid YAML: {_clip(str(e))}", source=source) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"invalid YAML{where}: {_clip(problem)}", source=source) from e


def parse_node(data: object, name: str, source: str) -> SimNode:
    """Validate a decoded node file; raises ConfigError listing every problem."""
    parser = _NodeParser()
    node = parser.node(data, name)
    if parser.problems or node is None:
        raise ConfigError(parser.problems or ["empty node description"], source=source)
    return node


class _NodeParser:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def node(self, data: object, name: str) -> SimNode | None:
        if not isinstance(data, dict):
            self.fail("node", "must be a mapping with a 'gpus' list")
            return None
        if data and not any(key in _NODE_FIELDS for key in data):
            self.fail(
                "node", f"not a simulated node file: no known top-level key ({describe_keys(list(data))})"
            )
            return None
        self.unknown(data, _NODE_FIELDS, "")
        driver = self.version(data, "driver_version", DEFAULT_DRIVER_VERSION, r"^\d+(\.\d+)+$")
        cuda = self.version(data, "cuda_driver_version", DEFAULT_CUDA_DRIVER_VERSION, _VERSION.pattern)
        seed = data.get("uuid_seed", name)
        if not isinstance(seed, str) or not seed:
            self.fail("uuid_seed", f"must be a non-empty string, got {_quote(seed)}")
            seed = name
        groups = data.get("gpus")
        if not isinstance(groups, list):
            self.fail("gpus", "required: a list of GPU entries ([] for a node without GPUs)")
            return None
        gpus: list[SimGpu] = []
        for n, group in enumerate(groups):
            gpus.extend(self.gpu_group(group, f"gpus[{n}]", len(gpus), seed))
        self.unique(gpus)
        return SimNode(
            name=name,
            driver_version=driver,
            cuda_driver_version=cuda,
            gpus=tuple(gpus),
            nvswitch_links=self.nvswitch(data.get("nvswitch"), gpus),
            nvlink_bridges=self.nvlinks(data.get("nvlinks"), len(gpus)),
            pcie_levels=self.pcie(data.get("pcie"), len(gpus)),
            fabric=parse_fabric(data.get("fabric"), len(gpus), self.fail),
        )

    def unknown(self, data: dict[Any, Any], accepted: tuple[str, ...], prefix: str) -> None:
        for key in data:
            if key not in accepted:
                self.fail(f"{prefix}{_clip(str(key))}", f"unknown field (accepted: {', '.join(accepted)})")

    def version(self, data: dict[Any, Any], key: str, default: str, pattern: str) -> str:
        value = data.get(key, default)
        text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
        if not re.match(pattern, text):
            self.fail(key, f"must be a version string like {_quote(default)}, got {_quote(value)}")
            return default
        return text

    def integer(self, value: object, where: str, minimum: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(where, f"must be an integer >= {minimum}, got {_quote(value)}")
            return None
        return value

    def per_gpu(self, group: dict[Any, Any], key: str, where: str, count: int) -> list[Any] | None:
        value = group.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != count:
            self.fail(
                f"{where}.{key}", f"must be a list of {count} entries (one per GPU), got {_quote(value)}"
            )
            return None
        return value

    def gpu_group(self, group: object, where: str, first: int, seed: str) -> list[SimGpu]:
        if not isinstance(group, dict):
            self.fail(where, f"must be a mapping with at least a 'name', got {_quote(group)}")
            return []
        self.unknown(group, _GPU_FIELDS, f"{where}.")
        name = group.get("name")
        if not isinstance(name, str) or not name:
            self.fail(f"{where}.name", "required: the GPU name NVML reports, e.g. 'NVIDIA A100-SXM4-40GB'")
            name = "?"
        count = self.integer(group.get("count", 1), f"{where}.count", 1) or 1
        model = MODELS.get(name)
        known = f"nvdp knows {', '.join(sorted(MODELS))}"

        memory = group.get("memory_mib", model.memory_mib if model else None)
        if memory is None:
            self.fail(f"{where}.memory_mib", f"required for GPU model {_quote(name)} ({known})")
            memory = 1
        memory = self.integer(memory, f"{where}.memory_mib", 1) or 1

        cc = self.compute_capability(group, where, model.compute_capability if model else None, name, known)

        mig_capable = group.get("mig_capable", bool(model and model.mig_slices))
        if not isinstance(mig_capable, bool):
            self.fail(f"{where}.mig_capable", f"must be true or false, got {_quote(mig_capable)}")
            mig_capable = False
        mig_slices = group.get("mig_slices", (model.mig_slices if model else 0) or 7)
        if mig_slices not in (4, 7) or isinstance(mig_slices, bool):
            self.fail(f"{where}.mig_slices", f"must be 7 (A100, H100) or 4 (A30), got {_quote(mig_slices)}")
            mig_slices = 7
        geometry = MigGeometry(memory, mig_slices, model.mig_memory_mib if model else None)
        layout = self.mig_layout(group, where, mig_capable, geometry)

        ecc = group.get("ecc", True)
        if not isinstance(ecc, bool):
            self.fail(f"{where}.ecc", f"must be true or false, got {_quote(ecc)}")
            ecc = True
        numa = self.numa(group, where, count)
        bus_ids = self.per_gpu(group, "pci_bus_ids", where, count)
        uuids = self.per_gpu(group, "uuids", where, count)
        minors = self.per_gpu(group, "minors", where, count)
        lost = self.lost(group, where, count)

        gpus = []
        for k in range(count):
            index = first + k
            bus_id = self.bus_id(bus_ids[k], f"{where}.pci_bus_ids[{k}]") if bus_ids else None
            uuid = uuids[k] if uuids else derived_uuid("GPU", f"{seed}/gpu/{index}")
            if not isinstance(uuid, str) or not uuid.startswith("GPU-"):
                self.fail(f"{where}.uuids[{k}]", f"must be a string starting with 'GPU-', got {_quote(uuid)}")
            minor = self.integer(minors[k], f"{where}.minors[{k}]", 0) if minors else index
            gpus.append(
                SimGpu(
                    index=index,
                    uuid=str(uuid),
                    name=name,
                    minor=index if minor is None else minor,
                    memory_mib=memory,
                    compute_capability=cc,
                    pci_bus_id=bus_id or f"{index // 16:08X}:{0x10 + index % 16 * 0x0E:02X}:00.0",
                    numa_node=numa[k],
                    ecc=ecc,
                    mig_capable=mig_capable,
                    mig_geometry=geometry,
                    mig=layout,
                    lost=lost[k],
                )
            )
        return gpus

    def lost(self, group: dict[Any, Any], where: str, count: int) -> list[bool]:
        """`lost: true` (every GPU of the group) or one true/false per GPU."""
        value = group.get("lost", False)
        if isinstance(value, bool):
            return [value] * count
        values = self.per_gpu(group, "lost", where, count)
        if values is None or not all(isinstance(v, bool) for v in values):
            if values is not None:
                self.fail(
                    f"{where}.lost", f"must be true, false or a list of {count} of them, got {_quote(value)}"
                )
            return [False] * count
        return values

    def compute_capability(
        self, group: dict[Any, Any], where: str, default: tuple[int, int] | None, name: str, known: str
    ) -> tuple[int, int]:
        value = group.get("compute_capability")
        if value is None:
            if default is None:
                self.fail(f"{where}.compute_capability", f"required for GPU model {_quote(name)} ({known})")
            return default or (0, 0)
        m = re.match(r"^(\d+)\.(\d+)$", str(value)) if isinstance(value, (str, float)) else None
        if m is None:
            self.fail(f"{where}.compute_capability", f"must be 'MAJOR.MINOR' like '8.0', got {_quote(value)}")
            return (0, 0)
        return (int(m[1]), int(m[2]))

    def mig_layout(
        self, group: dict[Any, Any], where: str, capable: bool, geometry: MigGeometry
    ) -> tuple[str, ...] | None:
        layout = group.get("mig")
        if layout is None:
            return None
        if not isinstance(layout, list) or not all(isinstance(p, str) for p in layout):
            self.fail(
                f"{where}.mig", f"must be a list of MIG profile names like '1g.5gb', got {_quote(layout)}"
            )
            return None
        if not capable:
            self.fail(f"{where}.mig", "this GPU is not MIG capable (set mig_capable: true)")
            return None
        try:
            place(layout, geometry)
        except MigLayoutError as e:
            self.fail(f"{where}.mig", str(e))
            return None
        return tuple(layout)

    def numa(self, group: dict[Any, Any], where: str, count: int) -> list[int | None]:
        if "numa" in group and "numa_nodes" in group:
            self.fail(where, "numa and numa_nodes are mutually exclusive")
        if "numa_nodes" in group:
            nodes = self.integer(group["numa_nodes"], f"{where}.numa_nodes", 1) or 1
            return [k * nodes // count for k in range(count)]
        value = group.get("numa", 0)
        values = value if isinstance(value, list) else [value] * count
        if len(values) != count:
            self.fail(
                f"{where}.numa", f"must be one node for all GPUs or a list of {count}, got {_quote(value)}"
            )
            return [0] * count
        result: list[int | None] = []
        for k, v in enumerate(values):
            at = f"{where}.numa" if not isinstance(value, list) else f"{where}.numa[{k}]"
            result.append(None if v is None else self.integer(v, at, 0))
        return result

    def bus_id(self, value: object, where: str) -> str | None:
        bus_id = _bus_id(value) if isinstance(value, str) else None
        if bus_id is None:
            self.fail(where, f"must be a PCI bus id like '00000000:07:00.0', got {_quote(value)}")
        return bus_id

    def unique(self, gpus: list[SimGpu]) -> None:
        for what in ("uuid", "pci_bus_id", "minor"):
            seen: dict[object, int] = {}
            for gpu in gpus:
                value = getattr(gpu, what)
                if value in seen:
                    self.fail(
                        "gpus", f"GPUs {seen[value]} and {gpu.index} have the same {what} {_quote(value)}"
                    )
                seen.setdefault(value, gpu.index)

    def nvswitch(self, value: object, gpus: list[SimGpu]) -> int:
        if value is None or value is False:
            return 0
        if value is True:
            model = MODELS.get(gpus[0].name) if gpus else None
            if model is None or not model.nvswitch_links:
                self.fail(
                    "nvswitch", "true needs a known HGX GPU model; write the links per GPU pair instead"
                )
                return 0
            return model.nvswitch_links
        return self.integer(value, "nvswitch", 0) or 0

    def pair_entries(
        self, value: object, key: str, n_gpus: int, fields: tuple[str, ...]
    ) -> list[tuple[str, dict[Any, Any], list[int]]]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"must be a list of entries with {' and '.join(fields)}, got {_quote(value)}")
            return []
        entries = []
        for n, entry in enumerate(value):
            where = f"{key}[{n}]"
            if not isinstance(entry, dict):
                self.fail(where, f"must be a mapping with {' and '.join(fields)}, got {_quote(entry)}")
                continue
            self.unknown(entry, fields, f"{where}.")
            gpus = entry.get("gpus")
            if (
                not isinstance(gpus, list)
                or len(gpus) < 2
                or len(set(map(str, gpus))) != len(gpus)
                or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < n_gpus for g in gpus)
            ):
                self.fail(
                    f"{where}.gpus", f"must be a list of 2 or more distinct GPU indices 0..{n_gpus - 1}"
                )
                continue
            entries.append((where, entry, gpus))
        return entries

    def nvlinks(self, value: object, n_gpus: int) -> dict[tuple[int, int], int]:
        bridges: dict[tuple[int, int], int] = {}
        for where, entry, gpus in self.pair_entries(value, "nvlinks", n_gpus, ("gpus", "links")):
            links = self.integer(entry.get("links"), f"{where}.links", 1)
            if len(gpus) != 2:
                self.fail(f"{where}.gpus", "an NVLink bridge joins exactly 2 GPUs")
            elif links is not None:
                pair = (min(gpus), max(gpus))
                if pair in bridges:
                    self.fail(f"{where}.gpus", f"GPUs {pair[0]} and {pair[1]} are already bridged")
                bridges[pair] = links
        return bridges

    def pcie(self, value: object, n_gpus: int) -> dict[tuple[int, int], PcieLevel]:
        levels: dict[tuple[int, int], PcieLevel] = {}
        accepted = ", ".join(level.name for level in PcieLevel)
        for where, entry, gpus in self.pair_entries(value, "pcie", n_gpus, ("gpus", "level")):
            name = entry.get("level")
            level = PcieLevel.__members__.get(name.upper()) if isinstance(name, str) else None
            if level is None:
                self.fail(f"{where}.level", f"must be one of {accepted}, got {_quote(name)}")
                continue
            for a in gpus:
                for b in gpus:
                    if a < b:
                        levels[(a, b)] = level
        return levels
