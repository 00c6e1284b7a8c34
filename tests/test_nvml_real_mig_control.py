"""The real backend's MIG making (nvdp.node.nvml.real_mig.RealMigControl) against the pynvml stand-in,
given the MIG calls: the pynvml functions called as pynvml calls them (placement structures, arrays
and count references), NVML's errors mapped by name, and what a made MIG device reads back as."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest

from nvdp.base.errors import NvmlError
from nvdp.node.nvml.real import RealNvml
from nvdp.node.nvml.types import MigPlacement
from tests.fake_pynvml import FakeGpu, FakeMig, FakePynvml, Handle, NVMLError

A100 = {  # GPU instance profile constant -> (profile id, slices, memory MiB, placements' starts, size)
    0x0: (19, 1, 4864, (0, 1, 2, 3, 4, 5, 6), 1),
    0x2: (9, 3, 19968, (0, 4), 4),
    0x4: (0, 7, 40192, (0,), 8),
}


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class MigPynvml(FakePynvml):
    """The stand-in with nvmlDeviceCreateGpuInstanceWithPlacement and its kin on one A100."""

    NVML_ERROR_INSUFFICIENT_RESOURCES = 23
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0xE
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
    c_nvmlGpuInstancePlacement_t = Placement
    c_nvmlComputeInstance_t = ctypes.c_uint

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.instances: dict[int, FakeMig] = {}  # GPU instance id -> its MIG device once a CI is made
        self.destroyed: list[str] = []

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return 0

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Handle, profile: int) -> SimpleNamespace:
        self._check("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if profile not in A100:
            raise NVMLError(2)  # INVALID_ARGUMENT: not a profile of this GPU
        pid, slices, memory, starts, _ = A100[profile]
        return SimpleNamespace(
            id=pid, sliceCount=slices, instanceCount=len(starts), memorySizeMB=memory,
            multiprocessorCount=14 * slices, copyEngineCount=slices, decoderCount=0, encoderCount=0,
            jpegCount=0, ofaCount=0,
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Handle, pid: int, out: Any, count: Any
    ) -> int:
        _, _, _, starts, size = next(v for v in A100.values() if v[0] == pid)
        for n, start in enumerate(starts):
            out[n].start, out[n].size = start, size
        ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents.value = len(starts)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Handle, pid: int, where: Placement) -> FakeMig:
        _, slices, memory, _, _ = next(v for v in A100.values() if v[0] == pid)
        taken = {n for m in self.instances.values() for n in range(m.start, m.start + m.memory_slices)}
        if taken & set(range(where.start, where.start + where.size)):
            raise NVMLError(self.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = FakeMig(f"MIG-{pid}-{where.start}", 1 + len(self.instances), 0, slices, slices, memory, pid)
        gi.start, gi.memory_slices = where.start, where.size
        self.instances[gi.gi_id] = gi
        return gi

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: FakeMig, profile: int, eng: int) -> Any:
        return SimpleNamespace(id=profile, instanceCount=1)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeMig, profile: int) -> int:
        self.gpus[0].mig_slots[len(self.gpus[0].mig_slots)] = gi
        return gi.gi_id

    def nvmlGpuInstanceGetComputeInstances(self, gi: FakeMig, profile: int, out: Any, count: Any) -> int:
        found = profile == gi.gpu_slices - 1 or (profile == 0 and gi.gpu_slices == 1)
        if found:
            out[0] = gi.gi_id
        ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents.value = int(found)
        return 0

    def nvmlComputeInstanceDestroy(self, ci: int) -> None:
        self.destroyed.append(f"ci of gi {ci}")

    def nvmlGpuInstanceDestroy(self, gi: FakeMig) -> None:
        self.destroyed.append(f"gi {gi.gi_id}")
        del self.instances[gi.gi_id]
        slots = self.gpus[0].mig_slots
        for slot in [s for s, m in slots.items() if m is gi]:
            del slots[slot]


def _opened() -> tuple[RealNvml, MigPynvml]:
    lib = MigPynvml([FakeGpu("GPU-0", "00000000:07:00.0", mig_mode=1)])
    nvml = RealNvml(pynvml=lib, sysfs_root="/nonexistent")
    nvml.init()
    return nvml, lib


def test_profiles_placements_make_and_destroy() -> None:
    nvml, lib = _opened()
    control = nvml.mig_control()
    profiles = control.mig_profiles("GPU-0")
    assert [(p.name, p.profile_id, [w.start for w in p.placements]) for p in profiles] == [
        ("1g.5gb", 19, [0, 1, 2, 3, 4, 5, 6]),
        ("3g.20gb", 9, [0, 4]),
        ("7g.40gb", 0, [0]),
    ]
    made = control.create_mig_device("GPU-0", MigPlacement(9, 4, 4))
    assert (made.uuid, made.profile, made.gi_id, made.placement) == (
        "MIG-9-4",
        "3g.20gb",
        1,
        MigPlacement(9, 4, 4),
    )
    with pytest.raises(NvmlError) as info:
        control.create_mig_device("GPU-0", MigPlacement(19, 5, 1))
    assert info.value.code == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    control.destroy_mig_device("GPU-0", made.gi_id)
    assert lib.destroyed == ["ci of gi 1", "gi 1"] and lib.gpus[0].mig_slots == {}


def test_mig_mode_off_has_no_profiles() -> None:
    lib = MigPynvml([FakeGpu("GPU-0", "00000000:07:00.0", mig_mode=0)])
    nvml = RealNvml(pynvml=lib, sysfs_root="/nonexistent")
    nvml.init()
    assert nvml.mig_control().mig_profiles("GPU-0") == ()
