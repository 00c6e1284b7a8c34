"""`Nvml.mig_layout()`, the device rescan's cheap query: on every backend it equals the layout part of
`gpus()` (profile names included: `+me` suffixes and compute-instance `1c.3g.40gb` forms), faulty and
hot-plugged GPUs included, and the real backend asks NVML only for what a layout holds."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import fake_pynvml as fake
import pytest
from fake_pynvml import FakeGpu, FakeMig, FakePynvml

from nvdp.base.errors import NvmlError
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim import open_sim
from nvdp.node.nvml.types import GpuLayout
from nvdp.plugins.kubeletplugin.rescan import layout_of
from tests import test_nvml_standin
from tests.test_nvml_real import opened

A100_80GB = 81920 * 1024 * 1024
ME = fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1  # the 1g.10gb+me GPU instance profile (A100 80GB)
ME_ID = 20  # its driver id on this fake GPU
LAYOUT_CALLS = {  # what one mig_layout() may ask NVML for, once the first enumeration is cached
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
}


def mig(uuid: str, gi: int, ci: int, g: int, c: int, memory_mb: int, profile_id: int = 0) -> FakeMig:
    return FakeMig(uuid, gi, ci, g, c, memory_mb, gi_profile_id=profile_id)


def fake_node() -> list[FakeGpu]:
    """GPU 0: 3g.40gb split into 1c.3g.40gb compute instances, a 1g.10gb+me and a 2g.20gb; GPU 1:
    MIG disabled; GPU 2: not MIG capable; GPU 3: MIG enabled without MIG devices."""
    slots = {
        0: mig("MIG-a", 1, 0, 3, 1, 39936),
        1: mig("MIG-b", 1, 1, 3, 1, 39936),
        2: mig("MIG-c", 1, 2, 3, 1, 39936),
        4: mig("MIG-d", 9, 0, 1, 1, 9856, ME_ID),
        5: mig("MIG-e", 3, 0, 2, 2, 19968),
    }
    enabled, disabled = fake.NVML_DEVICE_MIG_ENABLE, fake.NVML_DEVICE_MIG_DISABLE
    return [
        FakeGpu("GPU-0", "00000000:07:00.0", memory_bytes=A100_80GB, mig_mode=enabled, mig_slots=slots,
                gi_profiles={fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 0, ME: ME_ID}),
        FakeGpu("GPU-1", "00000000:0F:00.0", minor=1, mig_mode=disabled),
        FakeGpu("GPU-2", "00000000:47:00.0", minor=2),
        FakeGpu("GPU-3", "00000000:87:00.0", minor=3, mig_mode=enabled),
    ]  # fmt: skip


EXPECTED = {
    "GPU-0": GpuLayout(
        0,
        "GPU-0",
        True,
        (
            (1, 0, "1c.3g.40gb"),
            (1, 1, "1c.3g.40gb"),
            (1, 2, "1c.3g.40gb"),
            (3, 0, "2g.20gb"),
            (9, 0, "1g.10gb+me"),
        ),
        ("MIG-a", "MIG-b", "MIG-c", "MIG-d", "MIG-e"),
    ),
    "GPU-1": GpuLayout(1, "GPU-1", False),
    "GPU-2": GpuLayout(2, "GPU-2", False),
    "GPU-3": GpuLayout(3, "GPU-3", True),
}


@pytest.mark.parametrize("enumerated_first", [True, False], ids=["after-gpus", "fresh-backend"])
def test_real_layout_names_equal_the_enumerations(enumerated_first: bool) -> None:
    nvml = opened(FakePynvml(fake_node()))
    if enumerated_first:
        assert layout_of(nvml.gpus()) == EXPECTED
    assert nvml.mig_layout() == EXPECTED
    assert list(nvml.mig_layout()) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"], "index order"
    assert layout_of(nvml.gpus()) == nvml.mig_layout()


def test_real_layout_asks_only_for_the_layout() -> None:
    lib = FakePynvml(fake_node())
    nvml = opened(lib)
    nvml.gpus()
    lib.calls.clear()
    nvml.mig_layout()
    assert set(lib.calls) == LAYOUT_CALLS
    # Three compute instances share GPU instance 1: its profile is looked up once per query.
    assert lib.calls.count("nvmlDeviceGetGpuInstanceById") == 3  # GPU instances 1, 3, 9
    assert lib.calls.count("nvmlDeviceGetUUID") == 4 + 5, "4 GPUs and 5 MIG devices"
    made = len(lib.calls) - lib.calls.count("nvmlDeviceGetHandleByIndex") // 2  # the fake logs it twice
    # count; per GPU handle, UUID, MIG mode; per MIG GPU 1 + 7 slots; per MIG device 4; per GI 2
    assert made == 1 + 4 * 3 + 2 * 8 + 5 * 4 + 3 * 2


@pytest.mark.parametrize(
    ("errors", "enumerated_first", "expected"),
    [
        ({"nvmlDeviceGetMigMode": fake.NVML_ERROR_GPU_IS_LOST}, True, EXPECTED["GPU-0"]),
        ({"nvmlDeviceGetAttributes": fake.NVML_ERROR_UNKNOWN}, True, EXPECTED["GPU-0"]),
        ({"nvmlDeviceGetMigMode": fake.NVML_ERROR_GPU_IS_LOST}, False, GpuLayout(0, "GPU-0", False)),
        ({"nvmlDeviceGetMigMode": 15, "nvmlDeviceGetUUID": 15}, False, None),
    ],
    ids=["lost-after-listing", "failing-after-listing", "lost-before-listing", "no-uuid"],
)
def test_real_layout_of_a_failing_gpu_is_what_gpus_lists(
    errors: dict[str, int], enumerated_first: bool, expected: GpuLayout | None
) -> None:
    gpus = fake_node()
    nvml = opened(FakePynvml(gpus))
    if enumerated_first:
        nvml.gpus()
    gpus[0].errors = errors
    layout = nvml.mig_layout()
    assert layout.get("GPU-0") == expected
    assert {u: g for u, g in layout.items() if u != "GPU-0"} == {
        u: g for u, g in EXPECTED.items() if u != "GPU-0"
    }
    assert layout_of(nvml.gpus()) == layout


def test_real_layout_follows_hot_plug_and_raises_nvml_failures() -> None:
    lib = FakePynvml(fake_node())
    nvml = opened(lib)
    unplugged = lib.gpus.pop(1)
    assert list(nvml.mig_layout()) == ["GPU-0", "GPU-2", "GPU-3"]
    lib.gpus.append(unplugged)
    assert nvml.mig_layout()["GPU-1"] == GpuLayout(3, "GPU-1", False)
    nvml.shutdown()
    with pytest.raises(NvmlError, match="NVML_ERROR_UNINITIALIZED"):
        nvml.mig_layout()


def test_a_failing_gpu_is_listed_with_its_own_last_facts_after_indices_shift() -> None:
    """Last known facts are found by UUID, not index: indices shift when a GPU is unplugged or
    plugged back in front, and a GPU that comes back is a new one (listed with its fault)."""
    lib = FakePynvml(fake_node())
    nvml = opened(lib)
    first = nvml.gpus()
    unplugged = lib.gpus.pop(0)
    lib.gpus[0].errors = {"nvmlDeviceGetMemoryInfo": fake.NVML_ERROR_GPU_IS_LOST}  # GPU-1, index 0 now
    listed = nvml.gpus()
    assert listed[0] == replace(first[1], index=0)
    assert nvml.mig_layout()["GPU-1"] == GpuLayout(0, "GPU-1", False)
    lib.gpus.insert(0, unplugged)
    unplugged.errors = {
        call: fake.NVML_ERROR_GPU_IS_LOST for call in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMigMode")
    }
    back = nvml.gpus()
    assert [(g.uuid, g.index, g.fault is not None) for g in back[:2]] == [
        ("GPU-0", 0, True),
        ("GPU-1", 1, False),
    ]
    assert back[1] == first[1]
    assert nvml.mig_layout() == {**EXPECTED, "GPU-0": GpuLayout(0, "GPU-0", False)}


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-a100-mig", "pcie-4", "dgx-h100"])
def test_sim_layout_equals_the_enumerations(profile: str) -> None:
    nvml = open_nvml(f"sim:{profile}")
    nvml.init()
    try:
        assert nvml.mig_layout() == layout_of(nvml.gpus())
    finally:
        nvml.shutdown()


def test_sim_layout_follows_changes_and_lost_gpus() -> None:
    nvml = open_sim("dgx-a100-mig")
    nvml.init()
    try:
        first, second = list(nvml.mig_layout())[:2]
        nvml.inject({"uuid": first, "event": "gpu-lost"})  # before its first listing: MIG disabled
        nvml.inject({"uuid": second, "mig": ["3g.20gb", "2g.10gb", "1g.5gb"]})
        layout = nvml.mig_layout()
        assert layout[first] == GpuLayout(0, first, False)
        assert [p for _, _, p in layout[second].instances] == ["3g.20gb", "2g.10gb", "1g.5gb"]
        assert layout == layout_of(nvml.gpus())
        nvml.inject({"uuid": first, "event": "gpu-restored"})
        assert nvml.mig_layout() == layout_of(nvml.gpus())
    finally:
        nvml.shutdown()
    with pytest.raises(NvmlError, match="NVML_ERROR_UNINITIALIZED"):
        nvml.mig_layout()


# -- the C NVML stand-in (tests/nvml_standin) through the real pynvml ------------------------------

STANDIN_NODE = """driver 550.54.15
cuda 12040
gpu uuid=GPU-0 minor=0 memory_mib=81920 bus=00000000:07:00.0 numa=0 mig=1 name=NVIDIA A100-SXM4-80GB
gpu uuid=GPU-1 minor=1 memory_mib=81920 bus=00000000:0F:00.0 numa=0 mig=0 name=NVIDIA A100-SXM4-80GB
gpu uuid=GPU-2 minor=2 memory_mib=81920 bus=00000000:47:00.0 numa=1 mig=-1 name=NVIDIA A100-SXM4-80GB
mig gpu=0 uuid=MIG-a gi=1 ci=0 gi_slices=3 ci_slices=1 memory_mb=39936 profile=2
mig gpu=0 uuid=MIG-b gi=1 ci=1 gi_slices=3 ci_slices=1 memory_mb=39936 profile=2
mig gpu=0 uuid=MIG-c gi=9 ci=0 gi_slices=1 ci_slices=1 memory_mb=9856 profile=7
mig gpu=0 uuid=MIG-d gi=3 ci=0 gi_slices=2 ci_slices=2 memory_mb=19968 profile=1
"""
STANDIN_SCRIPT = """
import json, pynvml
from nvdp.node.nvml.real import RealNvml
from nvdp.plugins.kubeletplugin.rescan import layout_of
calls = []
for name in dir(pynvml):
    fn = getattr(pynvml, name)
    if name.startswith("nvml") and callable(fn):
        setattr(pynvml, name, (lambda n, f: lambda *a: (calls.append(n), f(*a))[1])(name, fn))
nvml = RealNvml(sysfs_root="/nonexistent")
nvml.init()
fresh = nvml.mig_layout()
full = layout_of(nvml.gpus())
calls.clear()
again = nvml.mig_layout()
print(json.dumps({"fresh": repr(fresh), "full": repr(full), "again": repr(again), "calls": calls}))
"""


# test_nvml_standin's fixture (the stand-in library, built once), used here by name
standin = test_nvml_standin.standin


def test_standin_layout_names_equal_the_enumerations(standin: Path, tmp_path: Path) -> None:
    (tmp_path / "node.txt").write_text(STANDIN_NODE)
    (tmp_path / "commands.txt").touch()
    env = {
        "LD_LIBRARY_PATH": str(standin),
        "NVML_STANDIN_NODE": str(tmp_path / "node.txt"),
        "NVML_STANDIN_COMMANDS": str(tmp_path / "commands.txt"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", STANDIN_SCRIPT], env=env, capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    expected = {
        "GPU-0": GpuLayout(
            0,
            "GPU-0",
            True,
            ((1, 0, "1c.3g.40gb"), (1, 1, "1c.3g.40gb"), (3, 0, "2g.20gb"), (9, 0, "1g.10gb+me")),
            ("MIG-a", "MIG-b", "MIG-c", "MIG-d"),
        ),
        "GPU-1": GpuLayout(1, "GPU-1", False),
        "GPU-2": GpuLayout(2, "GPU-2", False),
    }
    assert result["fresh"] == result["full"] == result["again"] == repr(expected)
    assert {c.removesuffix("_v2") for c in result["calls"]} <= LAYOUT_CALLS, result["calls"]


RECREATE_SCRIPT = """
import json, os, sys
from nvdp.node.nvml.real import RealNvml
nvml = RealNvml(sysfs_root="/nonexistent")
nvml.init()
before = nvml.mig_layout()["GPU-0"]
with open(os.environ["NVML_STANDIN_COMMANDS"], "a") as commands:
    commands.write(sys.argv[1])
after = nvml.mig_layout()["GPU-0"]
print(json.dumps([list(before.instances), list(after.instances), before.mig_uuids, after.mig_uuids]))
"""


def test_standin_layout_created_again_has_new_uuids(standin: Path, tmp_path: Path) -> None:
    """Real backend over the C stand-in: the same MIG devices destroyed and created again (new UUIDs,
    as the driver gives) read as a new layout with the same instances."""
    (tmp_path / "node.txt").write_text(STANDIN_NODE)
    (tmp_path / "commands.txt").touch()
    env = {
        "LD_LIBRARY_PATH": str(standin),
        "NVML_STANDIN_NODE": str(tmp_path / "node.txt"),
        "NVML_STANDIN_COMMANDS": str(tmp_path / "commands.txt"),
        "PATH": "/usr/bin:/bin",
    }
    migs = [line for line in STANDIN_NODE.splitlines() if line.startswith("mig ")]
    recreate = "mig-clear 0\n" + "".join(line.replace("uuid=MIG-", "uuid=MIG-new-") + "\n" for line in migs)
    done = subprocess.run(
        [sys.executable, "-c", RECREATE_SCRIPT, recreate], env=env, capture_output=True, text=True,
        timeout=60, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after, old_uuids, new_uuids = json.loads(done.stdout)
    assert before == after and len(before) == 4
    assert old_uuids == ["MIG-a", "MIG-b", "MIG-c", "MIG-d"]
    assert new_uuids == ["MIG-new-a", "MIG-new-b", "MIG-new-c", "MIG-new-d"]
