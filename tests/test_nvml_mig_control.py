"""MIG devices made and destroyed through the NVML facade's simulated backend, with NVML's profiles,
placements and error codes (nvdp.node.nvml.sim.mig_control)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.base.errors import NvmlError
from nvdp.node.nvml.sim import SimNvml, load_node_file, open_sim
from nvdp.node.nvml.types import MigPlacement

# (GPU slices, GPU instance profile id, memory slices, starts) as NVML's possible placements
# (nvmlDeviceGetGpuInstancePossiblePlacements_v2) are on an A100 / H100: 8 memory, 7 compute slices
EIGHT_SLICES = [
    (1, 19, 1, (0, 1, 2, 3, 4, 5, 6)), (1, 20, 1, (0, 1, 2, 3, 4, 5, 6)), (1, 15, 2, (0, 2, 4, 6)),
    (2, 14, 2, (0, 2, 4)), (3, 9, 4, (0, 4)), (4, 5, 4, (0,)), (7, 0, 8, (0,)),
]  # fmt: skip


def _mig_node(tmp_path: Path, gpu: str) -> SimNvml:
    path = tmp_path / "node.yaml"
    path.write_text(f'gpus: [{{name: "{gpu}", mig: []}}]\n')
    node = SimNvml(load_node_file(str(path)))
    node.init()
    return node


@pytest.mark.parametrize(
    ("gpu", "names"),
    [
        (
            "NVIDIA A100-SXM4-40GB",
            ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        ),
        (
            "NVIDIA A100-SXM4-80GB",
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            "NVIDIA H100 80GB HBM3",
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
    ],
    ids=["a100-40gb", "a100-80gb", "h100"],
)
def test_profiles_and_placements(tmp_path: Path, gpu: str, names: list[str]) -> None:
    node = _mig_node(tmp_path, gpu)
    profiles = node.mig_control().mig_profiles(node.gpus()[0].uuid)
    assert [p.name for p in profiles] == names
    got = [
        (int(p.name[0]), p.profile_id, p.placements[0].size, tuple(w.start for w in p.placements))
        for p in profiles
    ]
    assert got == EIGHT_SLICES
    assert all(w.profile_id == p.profile_id for p in profiles for w in p.placements)


def test_a100_40gb_profile_shares(tmp_path: Path) -> None:
    node = _mig_node(tmp_path, "NVIDIA A100-SXM4-40GB")
    by_name = {p.name: p for p in node.mig_control().mig_profiles(node.gpus()[0].uuid)}
    assert by_name["1g.5gb"].memory_bytes == 4864 << 20
    assert by_name["7g.40gb"].memory_bytes == 40192 << 20
    assert by_name["7g.40gb"].engines.multiprocessors == 98
    assert by_name["1g.5gb+me"].engines.ofa_engines == 1


def test_create_and_destroy() -> None:
    node = open_sim("dgx-a100-mig-empty")
    node.init()
    control, gpu = node.mig_control(), node.gpus()[0].uuid
    made = control.create_mig_device(gpu, MigPlacement(9, 4, 4))  # 3g.20gb at memory slices 4-7
    small = control.create_mig_device(gpu, MigPlacement(19, 0, 1))  # 1g.5gb at slice 0
    assert (made.profile, made.gi_id, made.ci_id, made.placement) == ("3g.20gb", 2, 0, MigPlacement(9, 4, 4))
    assert small.gi_id == 7 and made.uuid != small.uuid
    listed = node.gpus()[0].mig_devices
    assert [(m.gi_id, m.index, m.uuid) for m in listed] == [(2, 0, made.uuid), (7, 1, small.uuid)]
    assert node.mig_layout()[gpu].instances == ((2, 0, "3g.20gb"), (7, 0, "1g.5gb"))
    control.destroy_mig_device(gpu, made.gi_id)
    assert [m.uuid for m in node.gpus()[0].mig_devices] == [small.uuid]
    again = control.create_mig_device(gpu, MigPlacement(9, 4, 4))
    assert again.uuid != made.uuid  # a MIG device made again has a new UUID, as on NVML


@pytest.mark.parametrize(
    ("first", "second", "code"),
    [
        (MigPlacement(9, 4, 4), MigPlacement(19, 5, 1), "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (MigPlacement(0, 0, 8), MigPlacement(19, 0, 1), "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (MigPlacement(20, 0, 1), MigPlacement(20, 1, 1), "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (None, MigPlacement(19, 7, 1), "NVML_ERROR_INVALID_ARGUMENT"),
        (None, MigPlacement(14, 6, 2), "NVML_ERROR_INVALID_ARGUMENT"),
        (None, MigPlacement(42, 0, 1), "NVML_ERROR_INVALID_ARGUMENT"),
    ],
    ids=["overlap", "whole-gpu-taken", "second-me", "no-slice-7", "2g-at-6", "no-such-profile"],
)
def test_refusals(first: MigPlacement | None, second: MigPlacement, code: str) -> None:
    node = open_sim("dgx-a100-mig-empty")
    node.init()
    control, gpu = node.mig_control(), node.gpus()[0].uuid
    if first is not None:
        control.create_mig_device(gpu, first)
    before = node.gpus()[0].mig_devices
    with pytest.raises(NvmlError) as info:
        control.create_mig_device(gpu, second)
    assert info.value.code == code
    assert info.value.call == "nvmlDeviceCreateGpuInstanceWithPlacement"
    assert node.gpus()[0].mig_devices == before  # nothing made


def test_mig_mode_off_and_unknown_instance() -> None:
    node = open_sim("dgx-a100")
    node.init()
    control, gpu = node.mig_control(), node.gpus()[0].uuid
    assert control.mig_profiles(gpu) == ()
    with pytest.raises(NvmlError) as info:
        control.create_mig_device(gpu, MigPlacement(19, 0, 1))
    assert info.value.code == "NVML_ERROR_NOT_SUPPORTED"
    empty = open_sim("dgx-a100-mig-empty")
    empty.init()
    with pytest.raises(NvmlError) as gone:
        empty.mig_control().destroy_mig_device(empty.gpus()[0].uuid, 3)
    assert gone.value.code == "NVML_ERROR_NOT_FOUND"
