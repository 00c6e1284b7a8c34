"""The simulated NVML backend: built-in profiles, node files, MIG geometry, events, fault injection."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError, GpuLostError, NvmlError, NvmlNotSupported
from nvdp.node.nvml import EventType, GpuInfo, NvmlEvent, PcieLevel, ProbeResult, open_nvml
from nvdp.node.nvml.sim import SimEventError, SimNvml, layout, load_node_file, open_sim, profile_names
from nvdp.node.nvml.sim.follower import FileFollower
from nvdp.node.nvml.sim.mig import MigGeometry, MigLayoutError, place
from nvdp.node.nvml.types import GpuLayout, MigEngines, MigPlacement
from testkit import wait_until

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIB = 1024 * 1024
XID = EventType.XID_CRITICAL
DBE = EventType.DOUBLE_BIT_ECC
SBE = EventType.SINGLE_BIT_ECC
WAIT_MS = 5000  # deadline for events that must arrive; they normally do within ~20-50 ms


@pytest.fixture
def nodes() -> Iterator[list[SimNvml]]:
    """Opened simulated nodes, shut down after the test."""
    opened: list[SimNvml] = []
    yield opened
    for node in opened:
        node.shutdown()


def start(nodes: list[SimNvml], target: str, events: Path | None = None) -> SimNvml:
    node = open_sim(target, events_path=str(events) if events else None)
    node.init()
    nodes.append(node)
    return node


# -- built-in profiles -------------------------------------------------------------------------


def test_builtin_profiles() -> None:
    assert profile_names() == [
        "dgx-a100",
        "dgx-a100-mig",
        "dgx-a100-mig-empty",
        "dgx-h100",
        "gb200-nvl",
        "pcie-4",
    ]


@pytest.mark.parametrize(
    ("profile", "count", "name", "memory_mib", "cc", "numa", "nvlinks"),
    [
        ("dgx-a100", 8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), [0] * 4 + [1] * 4, 12),
        ("dgx-a100-mig", 8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), [0] * 4 + [1] * 4, 12),
        ("dgx-a100-mig-empty", 8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), [0] * 4 + [1] * 4, 12),
        ("dgx-h100", 8, "NVIDIA H100 80GB HBM3", 81559, (9, 0), [0] * 4 + [1] * 4, 18),
        ("gb200-nvl", 4, "NVIDIA GB200", 189471, (10, 0), [0, 0, 1, 1], 18),
        ("pcie-4", 4, "NVIDIA L40S", 46068, (8, 9), [0, 0, 1, 1], None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_profile_facts(
    nodes: list[SimNvml],
    profile: str,
    count: int,
    name: str,
    memory_mib: int,
    cc: tuple[int, int],
    numa: list[int],
    nvlinks: int | None,
) -> None:
    node = start(nodes, profile)
    gpus = node.gpus()
    assert [g.index for g in gpus] == list(range(count))
    assert [g.minor for g in gpus] == list(range(count))
    assert {(g.name, g.memory_mib, g.compute_capability) for g in gpus} == {(name, memory_mib, cc)}
    assert [g.numa_node for g in gpus] == numa
    assert all(GPU_UUID.match(g.uuid) for g in gpus)
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == count
    assert all(re.match(r"^[0-9A-F]{8}:[0-9A-F]{2}:00\.0$", g.pci_bus_id) for g in gpus)
    versions = ("570.133.20", "12.8") if profile == "gb200-nvl" else ("550.54.15", "12.4")  # Blackwell
    assert (node.driver_version(), node.cuda_driver_version()) == versions
    if nvlinks is not None:  # NVSwitch: every pair
        assert {node.link(a.uuid, b.uuid).nvlinks for a, b in combinations(gpus, 2)} == {nvlinks}


def test_dgx_a100_pcie_and_mig_capability(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100")
    gpus = node.gpus()
    assert gpus[0].pci_bus_id == "00000000:07:00.0"
    assert all(g.mig_capable and not g.mig_enabled and g.mig_devices == () for g in gpus)
    assert node.link(gpus[0].uuid, gpus[1].uuid).pcie == PcieLevel.MULTIPLE  # PCIe switch pair
    assert node.link(gpus[0].uuid, gpus[3].uuid).pcie == PcieLevel.NODE
    assert node.link(gpus[3].uuid, gpus[4].uuid).pcie == PcieLevel.SYSTEM


def test_pcie_4_topology(nodes: list[SimNvml]) -> None:
    node = start(nodes, "pcie-4")
    u = [g.uuid for g in node.gpus()]
    assert (node.link(u[0], u[1]).nvlinks, node.link(u[0], u[1]).pcie) == (4, PcieLevel.HOSTBRIDGE)
    assert (node.link(u[3], u[2]).nvlinks, node.link(u[3], u[2]).pcie) == (4, PcieLevel.HOSTBRIDGE)
    for a, b in [(0, 2), (0, 3), (1, 2), (1, 3)]:
        assert (node.link(u[a], u[b]).nvlinks, node.link(u[a], u[b]).pcie) == (0, PcieLevel.SYSTEM)
    assert not any(g.mig_capable for g in node.gpus())


def test_dgx_a100_mig_structure(nodes: list[SimNvml]) -> None:
    gpus = start(nodes, "dgx-a100-mig").gpus()

    def layout(g: GpuInfo) -> list[tuple[int, int, int, str, int]]:
        return [(m.index, m.gi_id, m.ci_id, m.profile, m.memory_bytes // MIB) for m in g.mig_devices]

    assert layout(gpus[0]) == [(n, 7 + n, 0, "1g.5gb", 4864) for n in range(7)]
    assert layout(gpus[1]) == [(n, 3 + n, 0, "2g.10gb", 9984) for n in range(3)]
    assert layout(gpus[2]) == [
        (0, 1, 0, "3g.20gb", 19968),
        (1, 5, 0, "2g.10gb", 9984),
        (2, 13, 0, "1g.5gb", 4864),
    ]
    assert layout(gpus[3]) == [(0, 0, 0, "7g.40gb", 40192)]
    assert all(g.mig_enabled for g in gpus[:4]) and not any(g.mig_enabled for g in gpus[4:])
    migs = [m for g in gpus for m in g.mig_devices]
    assert all(MIG_UUID.match(m.uuid) for m in migs) and len({m.uuid for m in migs}) == 14
    assert all((m.parent_uuid, m.parent_index) == (g.uuid, g.index) for g in gpus for m in g.mig_devices)


def test_mig_devices_carry_placement_and_engines_as_nvml_reports_them(nodes: list[SimNvml]) -> None:
    gpus = start(nodes, "dgx-a100-mig").gpus()
    assert [(m.profile, m.placement) for m in gpus[2].mig_devices] == [
        ("3g.20gb", MigPlacement(9, 0, 4)),
        ("2g.10gb", MigPlacement(14, 4, 2)),
        ("1g.5gb", MigPlacement(19, 6, 1)),
    ]
    assert gpus[3].mig_devices[0].placement == MigPlacement(0, 0, 8)
    assert [m.engines for m in gpus[2].mig_devices] == [
        MigEngines(42, 3, 2, 0, 0, 0),
        MigEngines(28, 2, 1, 0, 0, 0),
        MigEngines(14, 1, 0, 0, 0, 0),
    ]
    assert gpus[3].mig_devices[0].engines == MigEngines(98, 7, 5, 0, 1, 1)


@pytest.mark.parametrize(
    ("layout", "memory_slices", "ids"),
    [
        (["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb"], 8, [19, 20, 15, 14]),
        (["1g.6gb", "1g.6gb+me", "2g.12gb"], 4, [14, 21, 5]),
    ],
    ids=["A100", "A30"],
)
def test_gpu_instance_profile_ids_are_the_drivers(
    layout: list[str], memory_slices: int, ids: list[int]
) -> None:
    geometry = MigGeometry(40960 if memory_slices == 8 else 24576, 7 if memory_slices == 8 else 4)
    placed = sorted(place(layout, geometry), key=lambda d: layout.index(d.profile))
    assert [d.placement.profile_id for d in placed] == ids


def test_uuids_are_deterministic(nodes: list[SimNvml]) -> None:
    first = start(nodes, "dgx-a100-mig").gpus()
    second = start(nodes, "dgx-a100-mig").gpus()
    assert first == second
    assert [g.uuid for g in start(nodes, "dgx-a100").gpus()] == [g.uuid for g in first]  # same machine
    assert not {g.uuid for g in first} & {g.uuid for g in start(nodes, "dgx-h100").gpus()}


# -- open_nvml ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "sim:dgx-z9",
            "unknown simulated node profile 'dgx-z9'; accepted: dgx-a100, dgx-a100-mig, dgx-a100-mig-empty, "
            "dgx-h100, gb200-nvl, pcie-4",
        ),
        (
            "simulated",
            "--nvml: unknown backend 'simulated'; accepted: real, sim:NAME, sim:/path/to/node.yaml",
        ),
        ("sim:", "--nvml: unknown backend 'sim:'"),
        ("/tmp/node.yaml", "--nvml: unknown backend '/tmp/node.yaml'"),
    ],
    ids=["unknown-profile", "unknown-backend", "empty-sim", "bare-path"],
)
def test_open_nvml_refuses_unknown_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_nvml(spec)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_open_nvml_reads_the_events_file_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NVDP_SIM_EVENTS", str(tmp_path / "ignored"))  # the environment is passed in
    node = open_nvml("sim:pcie-4", environ={"NVDP_SIM_EVENTS": str(tmp_path / "events")})
    assert isinstance(node, SimNvml) and node.events_path == str(tmp_path / "events")
    assert open_nvml("sim:pcie-4").events_path is None  # type: ignore[attr-defined]


# -- node files --------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_minimal_64_gpu_node(tmp_path: Path, nodes: list[SimNvml]) -> None:
    path = write(
        tmp_path, 'gpus: [{count: 64, name: "NVIDIA H100 80GB HBM3", numa_nodes: 8}]\nnvswitch: true\n'
    )
    node = start(nodes, f"{path}")
    gpus = node.gpus()
    assert len(gpus) == 64 and len({g.pci_bus_id for g in gpus}) == 64
    assert [g.numa_node for g in gpus] == [n // 8 for n in range(64)]
    assert gpus[0].memory_mib == 81559 and gpus[0].compute_capability == (9, 0) and gpus[0].mig_capable
    assert node.link(gpus[0].uuid, gpus[63].uuid).nvlinks == 18
    assert node.link(gpus[0].uuid, gpus[7].uuid).pcie == PcieLevel.NODE
    assert node.link(gpus[0].uuid, gpus[8].uuid).pcie == PcieLevel.SYSTEM
    again = open_nvml(f"sim:{path}")
    assert isinstance(again, SimNvml) and again.node.gpus[5].uuid == gpus[5].uuid


def test_full_node_file(tmp_path: Path, nodes: list[SimNvml]) -> None:
    path = write(
        tmp_path,
        """
driver_version: "535.161.08"
cuda_driver_version: "12.2"
uuid_seed: lab-7
gpus:
  - name: Custom GPU
    memory_mib: 24576
    compute_capability: "8.6"
    numa: null
    ecc: false
    uuids: [GPU-11111111-2222-3333-4444-555555555555]
    pci_bus_ids: ["0000:3b:00.0"]
    minors: [4]
  - name: NVIDIA A100-SXM4-80GB
    count: 2
    numa: [0, 1]
    mig: [1c.3g.40gb, 1c.3g.40gb, 1c.3g.40gb, 1g.10gb, 1g.20gb]
nvlinks:
  - {gpus: [1, 2], links: 12}
pcie:
  - {gpus: [0, 1, 2], level: hostbridge}
""",
    )
    node = start(nodes, str(path))
    gpus = node.gpus()
    assert node.driver_version() == "535.161.08" and node.cuda_driver_version() == "12.2"
    first = gpus[0]
    assert (first.uuid, first.pci_bus_id, first.minor, first.numa_node) == (
        "GPU-11111111-2222-3333-4444-555555555555",
        "00000000:3B:00.0",
        4,
        None,
    )
    assert (first.name, first.memory_mib, first.compute_capability, first.mig_capable) == (
        "Custom GPU",
        24576,
        (8, 6),
        False,
    )
    assert [(m.gi_id, m.ci_id, m.profile) for m in gpus[1].mig_devices] == [
        (1, 0, "1c.3g.40gb"),
        (1, 1, "1c.3g.40gb"),
        (1, 2, "1c.3g.40gb"),
        (5, 0, "1g.20gb"),
        (13, 0, "1g.10gb"),
    ]
    assert node.link(gpus[1].uuid, gpus[2].uuid) == node.link(gpus[2].uuid, gpus[1].uuid)
    assert (node.link(gpus[1].uuid, gpus[2].uuid).nvlinks, node.link(gpus[0].uuid, gpus[2].uuid).pcie) == (
        12,
        PcieLevel.HOSTBRIDGE,
    )
    registered = node.create_event_set()
    assert registered.register(first.uuid, XID | DBE) == XID  # no ECC on this GPU
    with pytest.raises(NvmlNotSupported):
        registered.register(first.uuid, DBE | SBE)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[]", "node: must be a mapping with a 'gpus' list"),
        ("driver_version: 550\n", "gpus: required: a list of GPU entries ([] for a node without GPUs)"),
        ("gpus: [{name: Tesla T4}]\ncolour: green\n", "colour: unknown field (accepted: driver_version,"),
        ("gpus: [{name: Tesla T4, colour: green}]", "gpus[0].colour: unknown field (accepted: name, count,"),
        ("gpus: [{count: 2}]", "gpus[0].name: required: the GPU name NVML reports"),
        ("gpus: [{name: Tesla T4, count: 0}]", "gpus[0].count: must be an integer >= 1, got 0"),
        ("gpus: [{name: Foo}]", "gpus[0].memory_mib: required for GPU model 'Foo' (nvdp knows NVIDIA A100"),
        ("gpus: [{name: Foo, memory_mib: 1}]", "gpus[0].compute_capability: required for GPU model 'Foo'"),
        (
            "gpus: [{name: Tesla T4, compute_capability: eight}]",
            "gpus[0].compute_capability: must be 'MAJOR.MINOR'",
        ),
        ("gpus: [{name: Tesla T4, memory_mib: -5}]", "gpus[0].memory_mib: must be an integer >= 1, got -5"),
        (
            "gpus: [{name: Tesla T4, count: 2, numa: [0]}]",
            "gpus[0].numa: must be one node for all GPUs or a list of 2",
        ),
        ("gpus: [{name: Tesla T4, numa: -1}]", "gpus[0].numa: must be an integer >= 0, got -1"),
        (
            "gpus: [{name: Tesla T4, numa: 0, numa_nodes: 2}]",
            "gpus[0]: numa and numa_nodes are mutually exclusive",
        ),
        ("gpus: [{name: Tesla T4, pci_bus_ids: [x]}]", "gpus[0].pci_bus_ids[0]: must be a PCI bus id like"),
        ("gpus: [{name: Tesla T4, count: 2, uuids: [GPU-1]}]", "gpus[0].uuids: must be a list of 2 entries"),
        ("gpus: [{name: Tesla T4, uuids: [abc]}]", "gpus[0].uuids[0]: must be a string starting with 'GPU-'"),
        (
            "gpus: [{name: Tesla T4, count: 2, uuids: [GPU-1, GPU-1]}]",
            "gpus: GPUs 0 and 1 have the same uuid",
        ),
        ("gpus: [{name: Tesla T4, count: 2, minors: [3, 3]}]", "gpus: GPUs 0 and 1 have the same minor 3"),
        ("gpus: [{name: Tesla T4, mig: [1g.5gb]}]", "gpus[0].mig: this GPU is not MIG capable"),
        (
            "gpus: [{name: NVIDIA A100-SXM4-40GB, mig: 1g.5gb}]",
            "gpus[0].mig: must be a list of MIG profile names",
        ),
        ("gpus: [{name: NVIDIA A100-SXM4-40GB, mig: [1g.6gb]}]", "gpus[0].mig: 1g.6gb: no such MIG profile"),
        (
            "gpus: [{name: NVIDIA A100-SXM4-40GB, mig: [4g.20gb, 4g.20gb]}]",
            "gpus[0].mig: 4g.20gb, 4g.20gb: these",
        ),
        ("gpus: [{name: NVIDIA A100-SXM4-40GB, mig: [big]}]", "gpus[0].mig: 'big' is not a MIG profile name"),
        (
            "gpus: [{name: NVIDIA A100-SXM4-40GB, mig_slices: 3}]",
            "gpus[0].mig_slices: must be 7 (A100, H100)",
        ),
        ("gpus: [{name: Tesla T4, ecc: maybe}]", "gpus[0].ecc: must be true or false, got 'maybe'"),
        ("gpus: [{name: Tesla T4}]\nnvswitch: true\n", "nvswitch: true needs a known HGX GPU model"),
        ("gpus: [{name: Tesla T4}]\nnvswitch: -1\n", "nvswitch: must be an integer >= 0, got -1"),
        (
            "gpus: [{name: Tesla T4, count: 2}]\nnvlinks: [{gpus: [0, 2], links: 4}]",
            "nvlinks[0].gpus: must be a list",
        ),
        (
            "gpus: [{name: Tesla T4, count: 2}]\nnvlinks: [{gpus: [0, 1]}]",
            "nvlinks[0].links: must be an integer >= 1",
        ),
        (
            "gpus: [{name: Tesla T4, count: 3}]\nnvlinks: [{gpus: [0, 1, 2], links: 1}]",
            "nvlinks[0].gpus: an NVLink bridge joins exactly 2",
        ),
        (
            "gpus: [{name: Tesla T4, count: 2}]\n"
            "nvlinks: [{gpus: [0, 1], links: 1}, {gpus: [1, 0], links: 1}]",
            "nvlinks[1].gpus: GPUs 0 and 1 are already bridged",
        ),
        (
            "gpus: [{name: Tesla T4, count: 2}]\npcie: [{gpus: [0, 1], level: PIX}]",
            "pcie[0].level: must be one of INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM, got 'PIX'",
        ),
        (
            "gpus: [{name: Tesla T4}]\npcie: {gpus: [0, 1]}",
            "pcie: must be a list of entries with gpus and level",
        ),
        ("gpus: [{name: Tesla T4}]\ncuda_driver_version: twelve\n", "cuda_driver_version: must be a version"),
        ("gpus: [{name: Tesla T4}]\nuuid_seed: ''\n", "uuid_seed: must be a non-empty string"),
        ("gpus: [{name: Tesla T4}\n", "invalid YAML at line 2"),
    ],
    ids=lambda v: v.split(":")[0].split("\n")[-1][:40] if isinstance(v, str) else None,
)
def test_node_file_validation(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_node_file(path)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    assert str(info.value).startswith(f"{path}: ")
    assert all("\n" not in p for p in info.value.problems)


def test_node_file_reports_every_problem_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus: [{name: Foo, count: x}, {name: Tesla T4, ecc: 1}]\nnvswitch: many\n")
    with pytest.raises(ConfigError) as info:
        load_node_file(path)
    fields = [p.split(":")[0] for p in info.value.problems]
    assert fields == [
        "gpus[0].count",
        "gpus[0].memory_mib",
        "gpus[0].compute_capability",
        "gpus[1].ecc",
        "nvswitch",
    ]


def test_missing_node_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read simulated node file: No such file"):
        open_nvml(f"sim:{tmp_path}/absent.yaml")


# -- MIG geometry ------------------------------------------------------------------------------

A100_40 = MigGeometry(40960, 7, {1: 4864, 2: 9984, 4: 19968, 8: 40192})
H100 = MigGeometry(81559, 7)
A30 = MigGeometry(24576, 4)


@pytest.mark.parametrize(
    ("geometry", "layout", "placed"),
    [
        (
            A100_40,
            ["3g.20gb", "2g.10gb", "2g.10gb"],
            [(2, 0, "3g.20gb"), (3, 0, "2g.10gb"), (4, 0, "2g.10gb")],
        ),
        (
            A100_40,
            ["4g.20gb", "2g.10gb", "1g.5gb"],
            [(1, 0, "4g.20gb"), (5, 0, "2g.10gb"), (13, 0, "1g.5gb")],
        ),
        (A100_40, ["3g.20gb", "3g.20gb"], [(1, 0, "3g.20gb"), (2, 0, "3g.20gb")]),
        (A100_40, ["1g.5gb+me"], [(7, 0, "1g.5gb+me")]),
        (
            A100_40,
            ["1c.2g.10gb", "1c.2g.10gb", "1c.2g.10gb"],
            [(3, 0, "1c.2g.10gb"), (3, 1, "1c.2g.10gb"), (4, 0, "1c.2g.10gb")],
        ),
        (H100, ["7g.80gb"], [(0, 0, "7g.80gb")]),
        (H100, ["1g.20gb", "1g.10gb", "1g.10gb"], [(3, 0, "1g.20gb"), (9, 0, "1g.10gb"), (10, 0, "1g.10gb")]),
        (A30, ["1g.6gb"] * 4, [(3, 0, "1g.6gb"), (4, 0, "1g.6gb"), (5, 0, "1g.6gb"), (6, 0, "1g.6gb")]),
        (A30, ["4g.24gb"], [(0, 0, "4g.24gb")]),
        (A100_40, [], []),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, list) and v and isinstance(v[0], str) else None,
)
def test_mig_placement(geometry: MigGeometry, layout: list[str], placed: list[tuple[int, int, str]]) -> None:
    assert [(d.gi_id, d.ci_id, d.profile) for d in place(layout, geometry)] == placed


def test_mig_memory() -> None:
    assert [d.memory_mib for d in place(["7g.40gb"], A100_40)] == [40192]
    assert [d.memory_mib for d in place(["1g.10gb", "7g.80gb"][:1], H100)] == [9856]


@pytest.mark.parametrize(
    ("geometry", "layout", "message"),
    [
        (A100_40, ["7g.40gb", "1g.5gb"], "do not fit one GPU (7 compute slices, 8 memory slices)"),
        (A100_40, ["1g.5gb"] * 8, "do not fit"),
        (A100_40, ["8g.40gb"], "no such MIG profile on a 40 GB GPU with 7 compute slices"),
        (H100, ["1g.5gb"], "one memory slice holds 10 GB"),
        (A100_40, ["3c.2g.10gb"], "a compute instance cannot be larger than its GPU instance"),
        (A100_40, ["1g.5GB"], "is not a MIG profile name"),
    ],
    ids=["too-many-slices", "eight-1g", "8g", "h100-1g.5gb", "c-greater-than-g", "upper-case"],
)
def test_mig_placement_refusals(geometry: MigGeometry, layout: list[str], message: str) -> None:
    with pytest.raises(MigLayoutError, match=re.escape(message)):
        place(layout, geometry)


# -- NVML semantics ----------------------------------------------------------------------------


def test_calls_before_init_are_uninitialized() -> None:
    node = open_sim("dgx-a100")
    for call in (node.gpus, node.driver_version, node.create_event_set):
        with pytest.raises(NvmlError) as info:
            call()
        assert info.value.code == "NVML_ERROR_UNINITIALIZED"


def test_link_errors(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpus = node.gpus()
    with pytest.raises(NvmlError, match="NVML_ERROR_INVALID_ARGUMENT"):
        node.link(gpus[0].uuid, gpus[0].uuid)
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_FOUND device=GPU-nope"):
        node.link(gpus[0].uuid, "GPU-nope")
    with pytest.raises(NvmlNotSupported):
        node.link(gpus[0].mig_devices[0].uuid, gpus[1].uuid)


def test_register_returns_supported_subset_and_refuses_mig_and_unknown(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpus = node.gpus()
    events = node.create_event_set()
    assert events.register(gpus[0].uuid, XID | DBE | SBE) == XID | DBE | SBE
    with pytest.raises(NvmlNotSupported, match="nvmlDeviceRegisterEvents"):
        events.register(gpus[0].mig_devices[0].uuid, XID)
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_FOUND"):
        events.register("GPU-00000000-0000-0000-0000-000000000000", XID)


def test_events_reach_the_sets_that_registered_that_gpu_and_type(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100")
    g = [x.uuid for x in node.gpus()]
    first, second = node.create_event_set(), node.create_event_set()
    first.register(g[0], XID)
    second.register(g[0], DBE)
    second.register(g[1], XID)
    node.inject({"uuid": g[0], "xid": 79})
    node.inject({"uuid": g[0], "event": "double-bit-ecc"})
    node.inject({"uuid": g[1], "xid": 48})
    node.inject({"uuid": g[2], "xid": 79})  # nobody registered GPU 2
    node.inject({"uuid": g[1], "event": "single-bit-ecc"})  # nor single-bit ECC
    assert first.wait(0) == NvmlEvent(g[0], XID, 79)
    assert first.wait(0) is None
    assert second.wait(0) == NvmlEvent(g[0], DBE, 0)
    assert second.wait(0) == NvmlEvent(g[1], XID, 48)
    assert second.wait(0) is None


def test_wait_times_out(nodes: list[SimNvml]) -> None:
    events = start(nodes, "pcie-4").create_event_set()
    begin = time.monotonic()
    assert events.wait(50) is None
    assert time.monotonic() - begin >= 0.045


def test_mig_events_come_from_the_parent_with_instance_ids(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpu = node.gpus()[2]
    events = node.create_event_set()
    events.register(gpu.uuid, XID | DBE)
    node.inject({"uuid": gpu.mig_devices[1].uuid, "xid": 31})
    node.inject({"uuid": gpu.mig_devices[2].uuid, "event": "double-bit-ecc"})
    node.inject({"uuid": gpu.uuid, "xid": 94, "gi_id": 1, "ci_id": 0})
    assert events.wait(0) == NvmlEvent(gpu.uuid, XID, 31, gi_id=5, ci_id=0)
    assert events.wait(0) == NvmlEvent(gpu.uuid, DBE, 0, gi_id=13, ci_id=0)
    assert events.wait(0) == NvmlEvent(gpu.uuid, XID, 94, gi_id=1, ci_id=0)


def test_wait_error_fails_the_next_wait_of_every_set_once(nodes: list[SimNvml]) -> None:
    node = start(nodes, "pcie-4")
    g = node.gpus()[0].uuid
    sets = [node.create_event_set(), node.create_event_set()]
    for s in sets:
        s.register(g, XID)
    node.inject({"uuid": g, "xid": 43})
    node.inject({"event": "wait-error", "code": "NVML_ERROR_GPU_IS_LOST"})
    for s in sets:
        with pytest.raises(GpuLostError, match="nvmlEventSetWait_v2 failed: NVML_ERROR_GPU_IS_LOST"):
            s.wait(0)
        assert s.wait(0) == NvmlEvent(g, XID, 43)  # queued events survive the error
    node.inject({"event": "wait-error"})
    with pytest.raises(NvmlError) as info:
        sets[0].wait(0)
    assert info.value.code == "NVML_ERROR_UNKNOWN"


def test_gpu_lost_and_restored(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpus = node.gpus()
    lost = gpus[0]
    node.inject({"uuid": lost.uuid, "event": "gpu-lost"})
    for call in (
        lambda: node.probe(lost.uuid),
        lambda: node.probe(lost.mig_devices[0].uuid),
        lambda: node.create_event_set().register(lost.uuid, XID),
        lambda: node.link(lost.uuid, gpus[1].uuid),
    ):
        with pytest.raises(GpuLostError) as info:
            call()
        assert info.value.code == "NVML_ERROR_GPU_IS_LOST" and info.value.device == lost.uuid
    assert node.gpus() == gpus  # still enumerated
    assert node.probe(gpus[1].uuid) == ProbeResult()
    node.inject({"uuid": lost.uuid, "event": "gpu-restored"})
    assert node.probe(lost.uuid) == ProbeResult()


def test_probe_states(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-h100")
    g = node.gpus()[3].uuid
    node.inject({"uuid": g, "event": "retired-pages-pending"})
    node.inject({"uuid": g, "event": "row-remap-failure"})
    assert node.probe(g) == ProbeResult(retired_pages_pending=True, row_remap_failure=True)
    node.inject({"uuid": g, "event": "row-remap-pending"})
    assert node.probe(g).row_remap_pending
    node.inject({"uuid": g, "event": "clear-pending"})
    assert node.probe(g) == ProbeResult()


def test_mig_layout_changes(nodes: list[SimNvml]) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpus = node.gpus()
    node.inject({"uuid": gpus[4].uuid, "mig": ["1g.5gb", "1g.5gb", "2g.10gb"]})
    node.inject({"uuid": gpus[0].uuid, "mig": None})
    node.inject({"uuid": gpus[5].uuid, "mig": []})
    after = node.gpus()
    assert [(m.gi_id, m.profile) for m in after[4].mig_devices] == [
        (3, "2g.10gb"),
        (9, "1g.5gb"),
        (10, "1g.5gb"),
    ]
    assert not after[0].mig_enabled and after[0].mig_devices == ()
    assert after[5].mig_enabled and after[5].mig_devices == ()
    assert after[1:4] == gpus[1:4]
    # Back to the first layout: the instances are created again, so (as on real NVML) new MIG uuids,
    # and new ones again each time the same layout is applied.
    node.inject({"uuid": gpus[0].uuid, "mig": ["1g.5gb"] * 7})
    back = node.gpus()[0]
    assert replace(back, mig_devices=()) == replace(gpus[0], mig_devices=())
    assert [replace(m, uuid="") for m in back.mig_devices] == [
        replace(m, uuid="") for m in gpus[0].mig_devices
    ]
    assert not {m.uuid for m in back.mig_devices} & {m.uuid for m in gpus[0].mig_devices}
    node.inject({"uuid": gpus[0].uuid, "mig": ["1g.5gb"] * 7})
    again = node.mig_layout()[gpus[0].uuid]
    assert again.instances == GpuLayout.of(back).instances
    assert not set(again.mig_uuids) & {m.uuid for m in back.mig_devices}
    assert again == GpuLayout.of(node.gpus()[0])


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ({"uuid": "GPU-nope", "xid": 79}, "uuid: no GPU or MIG device 'GPU-nope'"),
        ({"xid": 79}, "uuid: required"),
        ({"uuid": 0, "event": "boom"}, "uuid: required"),
        ({"uuid": "@0", "event": "boom"}, "event: unknown 'boom' (accepted: wait-error, single-bit-ecc"),
        ({"uuid": "@0", "xid": "79"}, "xid: must be an integer from 0 to 2**64-1, got '79'"),
        ({"uuid": "@0", "xid": 2**64}, f"xid: must be an integer from 0 to 2**64-1, got {2**64}"),
        ({"uuid": "@0", "xid": -1}, "xid: must be an integer from 0 to 2**64-1, got -1"),
        (
            {"uuid": "@0", "xid": 79, "event": "gpu-lost"},
            "needs exactly one of 'xid', 'event', 'mig' or 'compute-mode'",
        ),
        ({"uuid": "@0", "xid": 79, "color": 1}, "unknown field 'color'"),
        ({"uuid": "@0", "xid": 79, "gi_id": -1}, "gi_id: must be an integer from 0 to 2**32-2, got -1"),
        ({"uuid": "@0", "xid": 79, "ci_id": 2**32 - 1}, "ci_id: must be an integer from 0 to 2**32-2"),
        ({"uuid": "@mig", "xid": 79, "gi_id": 1}, "gi_id: the instance comes from the MIG uuid"),
        ({"uuid": "@0", "event": "gpu-lost", "ci_id": 1}, "gi_id/ci_id do not apply to 'gpu-lost'"),
        ({"event": "wait-error", "code": "oops"}, "code: must be an NVML error name"),
        ({"uuid": "@0", "xid": 79, "code": "NVML_ERROR_UNKNOWN"}, "'code' goes only with"),
        ({"uuid": "@mig", "mig": []}, "mig: a MIG layout applies to a GPU uuid"),
        ({"uuid": "@0", "mig": "1g.5gb"}, "mig: must be null or a list of MIG profile names"),
        (
            {"uuid": "@0", "mig": ["7g.40gb", "7g.40gb"]},
            "mig: 7g.40gb, 7g.40gb: these MIG devices do not fit",
        ),
    ],
    ids=lambda v: None,
)
def test_injected_events_are_validated(
    nodes: list[SimNvml], event: str | dict[str, object], reason: str
) -> None:
    node = start(nodes, "dgx-a100-mig")
    gpus = node.gpus()
    placeholders = {"@0": gpus[0].uuid, "@mig": gpus[0].mig_devices[0].uuid}
    if isinstance(event, dict):
        event = {k: placeholders.get(str(v), v) if k == "uuid" else v for k, v in event.items()}
    with pytest.raises(SimEventError, match=re.escape(reason)):
        node.inject(event)
    assert node.gpus() == gpus


def test_mig_layout_on_a_gpu_that_is_not_mig_capable(nodes: list[SimNvml]) -> None:
    node = start(nodes, "pcie-4")
    with pytest.raises(SimEventError, match="GPU 0 .NVIDIA L40S. is not MIG capable"):
        node.inject({"uuid": node.gpus()[0].uuid, "mig": []})


def test_close_and_shutdown(nodes: list[SimNvml]) -> None:
    node = start(nodes, "pcie-4")
    g = node.gpus()[0].uuid
    closed, open_set = node.create_event_set(), node.create_event_set()
    closed.register(g, XID)
    open_set.register(g, XID)
    closed.close()
    closed.close()
    node.inject({"uuid": g, "xid": 79})
    with pytest.raises(NvmlError, match="NVML_ERROR_INVALID_ARGUMENT"):
        closed.wait(0)

    outcome: list[BaseException] = []
    assert open_set.wait(0) is not None

    def blocked_wait() -> None:
        try:
            open_set.wait(60_000)
        except NvmlError as e:
            outcome.append(e)

    waiter = threading.Thread(target=blocked_wait)
    waiter.start()
    # Shut down only once the waiter is blocked inside wait(): a wait() that starts after shutdown
    # raises UNINITIALIZED at once, which would pass without shutdown waking anything.
    wait_until(lambda: open_set._cond._waiters, 5, "the waiter blocked in wait()")  # type: ignore[attr-defined]
    node.shutdown()
    node.shutdown()
    waiter.join(timeout=5)
    assert not waiter.is_alive()
    assert [getattr(e, "code", None) for e in outcome] == ["NVML_ERROR_UNINITIALIZED"]
    node.init()  # a new session: old sets stay invalid
    with pytest.raises(NvmlError, match="NVML_ERROR_UNINITIALIZED"):
        open_set.wait(0)


# -- the NVDP_SIM_EVENTS file ------------------------------------------------------------------


def append(path: Path, *lines: object) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def follower_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvdp-sim-events"]


def test_events_file_lines_become_events(tmp_path: Path, nodes: list[SimNvml]) -> None:
    path = tmp_path / "events"
    append(path, {"uuid": "GPU-before-init", "xid": 1})  # before init: never read
    node = start(nodes, "dgx-a100-mig", path)
    gpu = node.gpus()[1]
    events = node.create_event_set()
    events.register(gpu.uuid, XID)
    append(path, {"uuid": gpu.mig_devices[0].uuid, "xid": 31})
    assert events.wait(WAIT_MS) == NvmlEvent(gpu.uuid, XID, 31, gi_id=3, ci_id=0)
    with path.open("a") as f:  # a line is read once complete
        f.write(json.dumps({"uuid": gpu.uuid, "xid": 79})[:10])
        f.flush()
        follower = node._follower
        assert follower is not None
        # The follower must have read the half line before the rest is written, else one read sees it all.
        wait_until(lambda: follower._offset == path.stat().st_size, 5, "the half line read")
        f.write(json.dumps({"uuid": gpu.uuid, "xid": 79})[10:] + "\n")
    assert events.wait(WAIT_MS) == NvmlEvent(gpu.uuid, XID, 79)
    append(path, {"uuid": gpu.uuid, "mig": None}, {"uuid": gpu.uuid, "xid": 13})
    assert events.wait(WAIT_MS) == NvmlEvent(gpu.uuid, XID, 13)
    assert not node.gpus()[1].mig_enabled


def test_events_file_bad_lines_are_logged_and_skipped(
    tmp_path: Path, nodes: list[SimNvml], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events"
    node = start(nodes, "pcie-4", path)
    g = node.gpus()[0].uuid
    events = node.create_event_set()
    events.register(g, XID)
    caplog.set_level(logging.WARNING, logger="nvdp.node.nvml.sim")
    append(path, "garbage", {"uuid": "GPU-x", "xid": 1}, {"uuid": g, "event": "melt"}, "", "# comment")
    append(path, {"uuid": g, "xid": 62})
    assert events.wait(WAIT_MS) == NvmlEvent(g, XID, 62)
    skipped = [r.getMessage() for r in caplog.records if "simulated event skipped" in r.getMessage()]
    assert len(skipped) == 3
    assert skipped[0].startswith(f"simulated event skipped file={path} reason='not JSON")
    assert "line='garbage'" in skipped[0]
    assert "reason=\"uuid: no GPU or MIG device 'GPU-x'" in skipped[1]
    assert "event: unknown 'melt'" in skipped[2]


def test_events_file_largest_xid_is_delivered(tmp_path: Path, nodes: list[SimNvml]) -> None:
    path = tmp_path / "events"
    node = start(nodes, "pcie-4", path)
    g = node.gpus()[0].uuid
    events = node.create_event_set()
    events.register(g, XID)
    append(path, {"uuid": g, "xid": 2**64}, {"uuid": g, "xid": 2**64 - 1})
    assert events.wait(WAIT_MS) == NvmlEvent(g, XID, 2**64 - 1)


def test_events_file_overlong_line_is_dropped_with_bounded_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines: list[str] = []
    path = tmp_path / "events"
    path.touch()
    follower = FileFollower(str(path), lines.append, max_line=100)
    follower.start()
    follower.stop()  # drive poll() by hand
    caplog.set_level(logging.WARNING, logger="nvdp.node.nvml.sim")
    with path.open("ab") as f:
        f.write(b"x" * 150)  # no newline yet: more than the limit
    follower.poll()
    assert follower._partial == b""
    with path.open("ab") as f:
        f.write(b"y" * 10_000 + b'\n{"ok": 1}\n' + b"z" * 99)
    follower.poll()
    assert lines == ['{"ok": 1}']
    assert len(follower._partial) == 99  # a line under the limit is kept until its newline
    with path.open("ab") as f:
        f.write(b"\n" + b"w" * 101 + b"\n")
    follower.poll()
    assert lines == ['{"ok": 1}', "z" * 99]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"simulated event line too long; skipped file={path} limit_bytes=100"] * 2


def test_events_file_created_after_open_truncated_and_replaced(tmp_path: Path, nodes: list[SimNvml]) -> None:
    path = tmp_path / "later" / "events"
    node = start(nodes, "pcie-4", path)
    g = node.gpus()[0].uuid
    events = node.create_event_set()
    events.register(g, XID)
    path.parent.mkdir()
    append(path, {"uuid": g, "xid": 1, "gi_id": 0, "ci_id": 0}, {"uuid": g, "xid": 2})  # created: read whole
    assert [events.wait(WAIT_MS), events.wait(WAIT_MS)] == [
        NvmlEvent(g, XID, 1, gi_id=0, ci_id=0),
        NvmlEvent(g, XID, 2),
    ]
    path.write_text(json.dumps({"uuid": g, "xid": 3}) + "\n")  # truncated, shorter than before
    assert events.wait(WAIT_MS) == NvmlEvent(g, XID, 3)
    replacement = tmp_path / "new"
    append(replacement, {"uuid": g, "xid": 4}, {"uuid": g, "xid": 5}, {"uuid": g, "xid": 6})
    os.replace(replacement, path)  # replaced by rename
    assert [events.wait(WAIT_MS) for _ in range(3)] == [NvmlEvent(g, XID, n) for n in (4, 5, 6)]
    path.unlink()
    append(path, {"uuid": g, "xid": 7})  # removed and created again
    assert events.wait(WAIT_MS) == NvmlEvent(g, XID, 7)


def test_follower_thread_stops_with_shutdown(tmp_path: Path) -> None:
    before = len(follower_threads())
    node = open_sim("pcie-4", events_path=str(tmp_path / "events"))
    node.init()
    node.init()
    assert len(follower_threads()) == before + 1
    assert all(t.daemon for t in follower_threads())
    node.shutdown()
    node.shutdown()
    assert len(follower_threads()) == before


@pytest.mark.parametrize(
    ("where", "said"),
    [
        pytest.param("dir", "simulated events file is a directory", id="a-directory"),
        pytest.param("missing/events", "simulated events file's directory does not exist", id="no-parent"),
    ],
)
def test_events_file_that_can_never_be_read_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, said: str
) -> None:
    (tmp_path / "dir").mkdir()
    follower = FileFollower(str(tmp_path / where), lambda line: None)
    with caplog.at_level(logging.WARNING, logger="nvdp.node.nvml.sim.follower"):
        follower.start()
        follower.stop()
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [said]


def test_events_file_yet_to_be_created_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    follower = FileFollower(str(tmp_path / "events"), lambda line: None)
    with caplog.at_level(logging.WARNING, logger="nvdp.node.nvml.sim.follower"):
        follower.start()
        follower.stop()
    assert caplog.records == []


def test_an_unchanged_layout_is_answered_without_reading_the_node_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DRA plugin's rescan asks twice a second: while no event was applied, the answer is kept."""
    node = open_sim("dgx-a100-mig")
    node.init()
    gpus = node.gpus()
    reads: list[None] = []
    read = layout.read_layout
    monkeypatch.setattr(layout, "read_layout", lambda *a: reads.append(None) or read(*a))
    first = node.mig_layout()
    assert node.mig_layout() == first and len(reads) == 1
    node.inject({"uuid": gpus[0].uuid, "mig": ["1g.5gb"] * 7})
    changed = node.mig_layout()[gpus[0].uuid]
    assert len(reads) == 2 and changed != first[gpus[0].uuid]
    assert changed == GpuLayout.of(node.gpus()[0])


def test_a_kept_layout_follows_mig_devices_made_and_destroyed() -> None:
    node = open_sim("dgx-a100-mig-empty")
    node.init()
    control, gpu = node.mig_control(), node.gpus()[0].uuid
    assert node.mig_layout()[gpu].instances == ()  # the answer kept from here
    made = control.create_mig_device(gpu, MigPlacement(9, 4, 4))
    assert node.mig_layout()[gpu].instances == ((made.gi_id, 0, "3g.20gb"),)
    control.destroy_mig_device(gpu, made.gi_id)
    assert node.mig_layout()[gpu].instances == ()
