"""The real NVML backend against a hand-written fake `pynvml` (tests/fake_pynvml.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fake_pynvml as fake
import pytest
from fake_pynvml import FakeGpu, FakeMig, FakePynvml

from nvdp.base.errors import GpuLostError, NvmlError, NvmlLibraryNotFound, NvmlNotSupported
from nvdp.node.health import HealthMonitor, HealthSettings
from nvdp.node.nvml import EventType, PcieLevel
from nvdp.node.nvml.library import LIBRARY_DIRS, library_candidates
from nvdp.node.nvml.naming import mig_profile_name, pcie_root_of, sysfs_bus_id
from nvdp.node.nvml.real import RealNvml
from nvdp.node.nvml.types import MigEngines, MigPlacement
from testkit import wait_until

GIB = 1024**3
BUS = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:87:00.0"]
SWITCH = ("00000000:C1:00.0", fake.NVML_NVLINK_DEVICE_TYPE_SWITCH)


def gpu(n: int, **kwargs: object) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-{n}", bus_id=BUS[n], minor=n, **kwargs)  # type: ignore[arg-type]


def opened(lib: FakePynvml, tmp_path: Path | None = None) -> RealNvml:
    """The real backend over `lib`, initialised; sysfs read under `tmp_path` (none by default)."""
    nvml = RealNvml(pynvml=lib, sysfs_root=str(tmp_path or "/nonexistent"))
    nvml.init()
    return nvml


def test_importing_the_package_does_not_import_pynvml() -> None:
    code = (
        "import sys, nvdp.node.nvml, nvdp.node.nvml.real; from nvdp.node.nvml import open_nvml;"
        "open_nvml('sim:dgx-a100'); assert 'pynvml' not in sys.modules, 'pynvml imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "exc", "code"),
    [
        (fake.NVML_ERROR_GPU_IS_LOST, GpuLostError, "NVML_ERROR_GPU_IS_LOST"),
        (fake.NVML_ERROR_NOT_SUPPORTED, NvmlNotSupported, "NVML_ERROR_NOT_SUPPORTED"),
        (fake.NVML_ERROR_NO_PERMISSION, NvmlError, "NVML_ERROR_NO_PERMISSION"),
        (fake.NVML_ERROR_UNKNOWN, NvmlError, "NVML_ERROR_UNKNOWN"),
        (12345, NvmlError, "NVML_ERROR_CODE_12345"),
    ],
    ids=["gpu-lost", "not-supported", "no-permission", "unknown", "unnamed-code"],
)
def test_nvml_errors_become_ours_with_name_call_and_device(
    value: int, exc: type[NvmlError], code: str
) -> None:
    g = gpu(0, errors={"nvmlDeviceGetMemoryInfo": value})
    nvml = opened(FakePynvml([g]))
    with pytest.raises(exc) as info:
        nvml.probe("GPU-0")
    assert type(info.value) is exc
    assert info.value.code == code
    assert info.value.device == "GPU-0"
    assert f"nvmlDeviceGetMemoryInfo failed: {code} device=GPU-0" in str(info.value)


def test_calls_before_init_raise_uninitialized() -> None:
    nvml = RealNvml(pynvml=FakePynvml([gpu(0)]))
    with pytest.raises(NvmlError, match="NVML_ERROR_UNINITIALIZED"):
        nvml.gpus()


def test_library_not_found_on_default_path() -> None:
    nvml = RealNvml(pynvml=FakePynvml([], library_found=False))
    with pytest.raises(
        NvmlLibraryNotFound, match="NVML_ERROR_LIBRARY_NOT_FOUND.*default search.*nvidia-driver-root"
    ):
        nvml.init()


def test_versions_and_shutdown() -> None:
    lib = FakePynvml([gpu(0)])
    lib.driver_version = b"550.54.15"
    nvml = opened(lib)
    assert nvml.driver_version() == "550.54.15"
    assert nvml.cuda_driver_version() == "12.4"
    nvml.shutdown()
    nvml.shutdown()
    assert lib.calls.count("nvmlShutdown") == 1


# -- library path ------------------------------------------------------------------------------


def make_lib(root: Path, subdir: str) -> str:
    path = root / subdir / "libnvidia-ml.so.1"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


def test_driver_root_library_is_loaded_and_handed_to_pynvml(tmp_path: Path) -> None:
    make_lib(tmp_path, "usr/lib")
    wanted = make_lib(tmp_path, "usr/lib/x86_64-linux-gnu")  # earlier in the search order
    loaded: list[str] = []

    def load(path: str) -> object:
        loaded.append(path)
        return f"handle:{path}"

    lib = FakePynvml([gpu(0)])
    nvml = RealNvml(str(tmp_path), pynvml=lib, load_library=load)
    nvml.init()
    assert loaded == [wanted]
    assert lib.nvmlLib == f"handle:{wanted}"  # pynvml's nvmlInit found it loaded and used it


def test_default_driver_root_leaves_loading_to_pynvml() -> None:
    lib = FakePynvml([gpu(0)])
    nvml = RealNvml("/", pynvml=lib, load_library=lambda p: pytest.fail(f"loaded {p}"))
    nvml.init()
    assert lib.nvmlLib == "default search path"
    assert library_candidates(["/", "", None]) == []


def test_container_driver_root_comes_before_the_driver_root(tmp_path: Path) -> None:
    make_lib(tmp_path / "host", "usr/lib64")
    wanted = make_lib(tmp_path / "ctr", "lib64")
    loaded: list[str] = []
    lib = FakePynvml([gpu(0)])
    nvml = RealNvml(
        str(tmp_path / "host"),
        container_driver_root=str(tmp_path / "ctr"),
        pynvml=lib,
        load_library=lambda p: loaded.append(p) or p,
    )
    nvml.init()
    assert loaded == [wanted]


def test_driver_root_without_the_library_falls_back_to_the_default_search(tmp_path: Path) -> None:
    lib = FakePynvml([gpu(0)])
    nvml = RealNvml(str(tmp_path), container_driver_root=str(tmp_path / "ctr"), pynvml=lib)
    nvml.init()
    assert lib.nvmlLib == "default search path"


def test_missing_library_names_every_path_tried(tmp_path: Path) -> None:
    nvml = RealNvml(
        str(tmp_path / "host"),
        container_driver_root=str(tmp_path / "ctr"),
        pynvml=FakePynvml([gpu(0)], library_found=False),
    )
    with pytest.raises(NvmlLibraryNotFound) as info:
        nvml.init()
    text = str(info.value)
    tried = [str(tmp_path / root / d / "libnvidia-ml.so.1") for root in ("ctr", "host") for d in LIBRARY_DIRS]
    positions = [text.index(path) for path in tried]
    assert positions == sorted(positions), "container root first, then the driver root, in order"
    assert text.index("libnvidia-ml.so.1 (default search: LD_LIBRARY_PATH, ldconfig cache)") > positions[-1]


def test_unloadable_library_is_skipped_and_named(tmp_path: Path) -> None:
    path = make_lib(tmp_path, "usr/lib64")

    def refuse(p: str) -> object:
        raise OSError(f"{p}: invalid ELF header")

    lib = FakePynvml([gpu(0)], library_found=False)
    nvml = RealNvml(str(tmp_path), pynvml=lib, load_library=refuse)
    with pytest.raises(NvmlLibraryNotFound, match="invalid ELF header") as info:
        nvml.init()
    assert path in str(info.value)


# -- enumeration -------------------------------------------------------------------------------


def test_whole_gpus() -> None:
    nvml = opened(
        FakePynvml([gpu(0, numa_node=0), gpu(1, numa_node=1, name="NVIDIA L40S", compute_capability=(8, 9))])
    )
    gpus = nvml.gpus()
    assert [(g.index, g.uuid, g.minor, g.pci_bus_id, g.numa_node) for g in gpus] == [
        (0, "GPU-0", 0, BUS[0], 0),
        (1, "GPU-1", 1, BUS[1], 1),
    ]
    assert gpus[1].name == "NVIDIA L40S" and gpus[1].compute_capability == (8, 9)
    assert gpus[0].memory_mib == 40960
    assert not gpus[0].mig_capable and not gpus[0].mig_enabled and gpus[0].mig_devices == ()


def test_mig_devices_skip_empty_slots_and_are_named_like_nvidia() -> None:
    slots = {
        0: FakeMig("MIG-a", gi_id=1, ci_id=0, gpu_slices=3, compute_slices=3, memory_mb=19968),
        2: FakeMig("MIG-b", gi_id=5, ci_id=0, gpu_slices=2, compute_slices=1, memory_mb=9984),
        3: FakeMig("MIG-c", gi_id=5, ci_id=1, gpu_slices=2, compute_slices=1, memory_mb=9984),
        6: FakeMig(
            "MIG-d", gi_id=13, ci_id=0, gpu_slices=1, compute_slices=1, memory_mb=4864, gi_profile_id=20
        ),
    }
    g = gpu(0, mig_mode=fake.NVML_DEVICE_MIG_ENABLE, mig_slots=slots)
    g.gi_profiles = {
        fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 19,
        fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
    }
    off = gpu(1, mig_mode=fake.NVML_DEVICE_MIG_DISABLE)
    gpus = opened(FakePynvml([g, off])).gpus()
    assert gpus[0].mig_capable and gpus[0].mig_enabled
    assert [(m.index, m.uuid, m.gi_id, m.ci_id, m.profile) for m in gpus[0].mig_devices] == [
        (0, "MIG-a", 1, 0, "3g.20gb"),
        (2, "MIG-b", 5, 0, "1c.2g.10gb"),
        (3, "MIG-c", 5, 1, "1c.2g.10gb"),
        (6, "MIG-d", 13, 0, "1g.5gb+me"),
    ]
    mig = gpus[0].mig_devices[0]
    assert (mig.memory_bytes, mig.parent_uuid, mig.parent_index) == (19968 * 1024 * 1024, "GPU-0", 0)
    assert gpus[1].mig_capable and not gpus[1].mig_enabled and gpus[1].mig_devices == ()


def test_mig_devices_carry_their_gpu_instance_placement_and_engines() -> None:
    slots = {
        0: FakeMig("MIG-a", 1, 0, 3, 3, 19968, gi_profile_id=9, start=4, memory_slices=4, multiprocessors=42,
                   engines=(3, 2, 0, 0, 0)),
        1: FakeMig("MIG-b", 2, 0, 1, 1, 4864, start=0),
    }  # fmt: skip
    g = gpu(0, mig_mode=fake.NVML_DEVICE_MIG_ENABLE, mig_slots=slots)
    g.errors = {}
    a, b = opened(FakePynvml([g])).gpus()[0].mig_devices
    assert a.placement == MigPlacement(profile_id=9, start=4, size=4)
    assert a.engines == MigEngines(42, 3, 2, 0, 0, 0)
    assert b.placement == MigPlacement(19, 0, 1)


def test_mig_placement_unknown_when_nvml_will_not_say() -> None:
    slots = {0: FakeMig("MIG-a", 1, 0, 1, 1, 4864)}
    g = gpu(0, mig_mode=fake.NVML_DEVICE_MIG_ENABLE, mig_slots=slots)
    g.errors = {"nvmlDeviceGetGpuInstanceById": fake.NVML_ERROR_NOT_SUPPORTED}
    (mig,) = opened(FakePynvml([g])).gpus()[0].mig_devices
    assert (mig.profile, mig.placement) == ("1g.5gb", None)


@pytest.mark.parametrize(
    ("g", "c", "memory_mb", "parent_gib", "name"),
    [
        (1, 1, 4864, 40, "1g.5gb"),
        (2, 2, 9984, 40, "2g.10gb"),
        (3, 3, 19968, 40, "3g.20gb"),
        (4, 4, 19968, 40, "4g.20gb"),
        (7, 7, 40192, 40, "7g.40gb"),
        (1, 1, 9856, 79.65, "1g.10gb"),
        (1, 1, 19968, 79.65, "1g.20gb"),
        (7, 7, 80896, 79.65, "7g.80gb"),
        (2, 1, 9984, 40, "1c.2g.10gb"),
    ],
    ids=lambda v: str(v),
)
def test_mig_profile_name(g: int, c: int, memory_mb: int, parent_gib: float, name: str) -> None:
    assert mig_profile_name(g, c, memory_mb, int(parent_gib * GIB)) == name


def test_lost_gpu_keeps_its_last_known_facts_in_enumeration() -> None:
    g = gpu(0)
    lib = FakePynvml([g, gpu(1)])
    nvml = opened(lib)
    first = nvml.gpus()
    g.errors["nvmlDeviceGetMemoryInfo"] = fake.NVML_ERROR_GPU_IS_LOST
    assert nvml.gpus() == first


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
    ],
)
def test_gpu_failing_at_first_enumeration_is_listed_with_its_fault(call: str) -> None:
    lost = gpu(1, numa_node=0, errors={call: fake.NVML_ERROR_GPU_IS_LOST})
    if call == "nvmlDeviceGetMaxMigDeviceCount":
        lost.mig_mode = fake.NVML_DEVICE_MIG_ENABLE
    nvml = opened(FakePynvml([gpu(0), lost, gpu(2)]))
    gpus = nvml.gpus()
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-1", "GPU-2"]
    assert gpus[0].fault is None and gpus[2].fault is None and gpus[2].memory_bytes > 0
    faulty = gpus[1]
    assert (faulty.index, faulty.minor, faulty.memory_bytes, faulty.mig_devices) == (1, 1, 0, ())
    assert faulty.fault is not None
    assert faulty.fault.startswith(f"{call} failed: NVML_ERROR_GPU_IS_LOST device=GPU-1")


def test_gpu_without_a_readable_uuid_is_left_out_and_node_errors_still_raise() -> None:
    nvml = opened(FakePynvml([gpu(0), gpu(1, errors={"nvmlDeviceGetUUID": fake.NVML_ERROR_GPU_IS_LOST})]))
    assert [g.uuid for g in nvml.gpus()] == ["GPU-0"]
    broken = opened(FakePynvml([gpu(0, errors={"nvmlDeviceGetMemoryInfo": fake.NVML_ERROR_UNINITIALIZED})]))
    with pytest.raises(NvmlError, match="NVML_ERROR_UNINITIALIZED"):
        broken.gpus()


# -- NUMA --------------------------------------------------------------------------------------


def write_numa(sysfs: Path, bus_id: str, value: str) -> None:
    path = sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node"
    path.parent.mkdir(parents=True)
    path.write_text(value + "\n")


def test_numa_node_from_sysfs_else_nvml(tmp_path: Path) -> None:
    write_numa(tmp_path, "0000:07:00.0", "5")  # sysfs wins over NVML's 3 (the GPU-memory node on GH200)
    write_numa(tmp_path, "0000:0f:00.0", "1")
    write_numa(tmp_path, "0000:47:00.0", "-1")  # no node in sysfs, none from NVML
    lib = FakePynvml([gpu(0, numa_node=3), gpu(1), gpu(2), gpu(3, numa_node=2)])  # GPU 3: no sysfs entry
    assert [g.numa_node for g in opened(lib, tmp_path).gpus()] == [5, 1, None, 2]


def test_numa_node_from_sysfs_when_the_binding_lacks_the_call(tmp_path: Path) -> None:
    class OldPynvml(FakePynvml):
        def __getattribute__(self, name: str) -> object:
            if name == "nvmlDeviceGetNumaNodeId":
                raise AttributeError(name)
            return super().__getattribute__(name)

    write_numa(tmp_path, "0000:07:00.0", "1")
    assert opened(OldPynvml([gpu(0, numa_node=0)]), tmp_path).gpus()[0].numa_node == 1


def test_sysfs_bus_id() -> None:
    assert sysfs_bus_id("00000000:0F:00.0") == "0000:0f:00.0"
    assert sysfs_bus_id("0001:B7:00.0") == "0001:b7:00.0"


# -- topology ----------------------------------------------------------------------------------


def test_nvlink_bridges_and_pcie_levels() -> None:
    g0 = gpu(0, nvlinks=[(BUS[1], 0)] * 4)
    g1 = gpu(1, nvlinks=[(BUS[0], 0)] * 4)
    g2, g3 = gpu(2), gpu(3)
    lib = FakePynvml([g0, g1, g2, g3])
    for a, b, level in [(0, 1, 30), (0, 2, 40), (0, 3, 50), (1, 2, 40), (1, 3, 50), (2, 3, 10)]:
        lib.topology[frozenset((f"GPU-{a}", f"GPU-{b}"))] = level
    nvml = opened(lib)
    assert (nvml.link("GPU-0", "GPU-1").nvlinks, nvml.link("GPU-0", "GPU-1").pcie) == (
        4,
        PcieLevel.HOSTBRIDGE,
    )
    assert nvml.link("GPU-1", "GPU-0").nvlinks == 4
    assert (nvml.link("GPU-0", "GPU-3").nvlinks, nvml.link("GPU-0", "GPU-3").pcie) == (0, PcieLevel.SYSTEM)
    assert nvml.link("GPU-2", "GPU-3").pcie == PcieLevel.SINGLE
    assert nvml.link("GPU-0", "GPU-2").pcie == PcieLevel.NODE


def test_nvswitch_links_count_when_p2p_over_nvlink_works() -> None:
    gpus = [gpu(n, nvlinks=[SWITCH] * 12) for n in range(3)]
    lib = FakePynvml(gpus)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        lib.topology[frozenset((f"GPU-{a}", f"GPU-{b}"))] = 40
    lib.p2p_nvlink[frozenset(("GPU-0", "GPU-2"))] = fake.NVML_P2P_STATUS_NOT_SUPPORTED  # fabric down
    nvml = opened(lib)
    assert nvml.link("GPU-0", "GPU-1").nvlinks == 12
    assert nvml.link("GPU-0", "GPU-2").nvlinks == 0
    before = len(lib.calls)
    nvml.link("GPU-1", "GPU-0")
    assert "nvmlDeviceGetNvLinkState" not in lib.calls[before:]  # link scans are cached


def test_link_to_itself_is_invalid() -> None:
    nvml = opened(FakePynvml([gpu(0)]))
    with pytest.raises(NvmlError, match="NVML_ERROR_INVALID_ARGUMENT"):
        nvml.link("GPU-0", "GPU-0")


def test_link_to_unknown_gpu_is_not_found() -> None:
    nvml = opened(FakePynvml([gpu(0)]))
    with pytest.raises(
        NvmlError, match="nvmlDeviceGetHandleByUUID failed: NVML_ERROR_NOT_FOUND device=GPU-9"
    ):
        nvml.link("GPU-0", "GPU-9")


# -- probe -------------------------------------------------------------------------------------


def test_probe_reports_pending_retirement_and_row_remapping() -> None:
    g = gpu(0, retired_pending=1, remapped_rows=(3, 1, 1, 1))
    result = opened(FakePynvml([g])).probe("GPU-0")
    assert result.retired_pages_pending and result.row_remap_pending and result.row_remap_failure


def test_probe_treats_unsupported_health_queries_as_unavailable() -> None:
    g = gpu(0, retired_pending=None, remapped_rows=None)
    result = opened(FakePynvml([g])).probe("GPU-0")
    assert not (result.retired_pages_pending or result.row_remap_pending or result.row_remap_failure)


def test_probe_of_a_mig_device_queries_its_parent() -> None:
    mig = FakeMig("MIG-a", gi_id=0, ci_id=0, gpu_slices=7, compute_slices=7, memory_mb=40192)
    g = gpu(0, mig_mode=1, mig_slots={0: mig}, retired_pending=1)
    assert opened(FakePynvml([g])).probe("MIG-a").retired_pages_pending


# -- events ------------------------------------------------------------------------------------


def test_event_set_registers_the_supported_subset_and_reports_instances() -> None:
    g0, g1 = gpu(0), gpu(1, supported_events=int(EventType.XID_CRITICAL))
    lib = FakePynvml([g0, g1])
    nvml = opened(lib)
    events = nvml.create_event_set()
    wanted = EventType.XID_CRITICAL | EventType.DOUBLE_BIT_ECC
    assert events.register("GPU-0", wanted) == wanted
    assert events.register("GPU-1", wanted) == EventType.XID_CRITICAL
    with pytest.raises(NvmlNotSupported, match="nvmlDeviceRegisterEvents.*GPU-1"):
        events.register("GPU-1", EventType.SINGLE_BIT_ECC)
    assert events.wait(10) is None  # NVML_ERROR_TIMEOUT
    lib.push_event(g0, int(EventType.XID_CRITICAL), 79)
    lib.push_event(g1, int(EventType.XID_CRITICAL), 31, gi=3, ci=0)
    lib.push_event(g1, int(EventType.DOUBLE_BIT_ECC), 0)  # not registered on GPU 1
    first, second = events.wait(10), events.wait(10)
    assert first is not None and second is not None
    assert (first.gpu_uuid, first.event_type, first.data, first.gi_id, first.ci_id) == (
        "GPU-0",
        EventType.XID_CRITICAL,
        79,
        None,
        None,
    )
    assert (second.gpu_uuid, second.data, second.gi_id, second.ci_id) == ("GPU-1", 31, 3, 0)
    assert events.wait(10) is None


def test_event_wait_errors_other_than_timeout_raise() -> None:
    lib = FakePynvml([gpu(0)])
    events = opened(lib).create_event_set()
    lib.initialized = False  # the driver went away under us
    with pytest.raises(NvmlError, match="nvmlEventSetWait_v2 failed: NVML_ERROR_UNINITIALIZED"):
        events.wait(10)


def test_event_set_close_is_idempotent() -> None:
    lib = FakePynvml([gpu(0)])
    events = opened(lib).create_event_set()
    events.close()
    events.close()
    assert lib.event_sets[0].freed == 1


# -- PCIe root ----------------------------------------------------------------------------------


def test_pcie_root_from_the_sysfs_link_else_none(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    hierarchy = tmp_path / "devices" / "pci0000:00" / "0000:00:01.1" / "0000:07:00.0"
    hierarchy.mkdir(parents=True)
    (devices / "0000:07:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.1/0000:07:00.0")
    (devices / "0000:0f:00.0").symlink_to("../../../devices/platform/0000:0f:00.0")  # no PCI hierarchy
    (devices / "0000:47:00.0").mkdir()  # not a link
    lib = FakePynvml([gpu(0), gpu(1), gpu(2), gpu(3)])  # GPU 3: no sysfs entry
    assert [g.pcie_root for g in opened(lib, tmp_path).gpus()] == ["pci0000:00", None, None, None]


@pytest.mark.parametrize(
    ("link", "root"),
    [
        ("../../../devices/pci0000:00/0000:00:01.1/0000:07:00.0", "pci0000:00"),
        ("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:07:00.0", "pci0000:3a"),
        ("/sys/devices/pci0008:00/0008:00:00.0/0000:07:00.0", "pci0008:00"),
        ("../../../devices/pci0000:00/0000:00:01.1/0000:08:00.0", None),
        ("../../../devices/platform/soc/0000:07:00.0", None),
        ("../../../devices/pci0000:00", None),
    ],
    ids=["root-port", "switch", "absolute", "another-device", "not-pci", "too-short"],
)
def test_pcie_root_of_a_link(link: str, root: str | None) -> None:
    assert pcie_root_of(link, "00000000:07:00.0") == root


# -- a stop during real NVML's event wait, which cannot be ended early ------------------------------


class UninterruptibleWait(FakePynvml):
    """nvmlEventSetWait_v2 as real NVML's: it returns at its timeout (or at `release`), nothing else."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.waiting = threading.Event()
        self.release = threading.Event()

    def nvmlEventSetWait_v2(self, event_set: fake.FakeEventSet, timeout_ms: int) -> Any:
        self.waiting.set()
        self.release.wait(timeout_ms / 1000)
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)


def test_a_stop_does_not_wait_for_nvmls_event_wait_and_nvml_stays_up_until_it_ends() -> None:
    """The health thread waits 5 s per turn (one wake-up per wait on an idle node); a stop returns
    without it, its event set is freed when the wait ends, and nvmlShutdown is left to the exit
    while a wait is under way (NVML would be torn down under the waiting thread)."""
    lib = UninterruptibleWait([gpu(0), gpu(1)])
    nvml = opened(lib)
    monitor = HealthMonitor(
        nvml, nvml.gpus(), lambda changes: None, settings=HealthSettings(probe_interval=3600)
    )
    monitor.start()
    assert lib.waiting.wait(10)
    started = time.monotonic()
    monitor.stop(timeout=0.2)
    assert time.monotonic() - started < 2.0  # not the 5 s wait
    assert not monitor.status().running
    nvml.shutdown()
    assert "nvmlShutdown" not in lib.calls
    assert lib.event_sets[0].freed == 0
    lib.release.set()  # the wait ends: the thread frees its set
    wait_until(lambda: lib.event_sets[0].freed == 1, 10, "the event set freed by its thread")
    monitor.start()  # a restart after such a stop runs one thread
    monitor.stop(timeout=5)
    assert [t for t in threading.enumerate() if t.name == "nvdp-health"] == []
