"""The DRA plugin's MPS daemons (`nvdp.dra.mps`) against the `nvidia-cuda-mps-control` stand-in and
the simulated node: one daemon per GPU set, started at the first holder and stopped after the last,
its GPUs EXCLUSIVE_PROCESS meanwhile, found again by a restarted plugin, started again when it no
longer answers; the clients' CDI edits; no config's sharing on a GPU shared by capacity."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nvdp.dra.claim_sharing import ClaimSharing
from nvdp.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.dra.devices import node_devices
from nvdp.dra.mps import ClientLimits, DraMps, MpsDaemon, client_edits, daemon_name
from nvdp.dra.sharing import DeviceSharing, OpaqueConfig
from nvdp.dra.timeslice import SimulatedTimeSlices
from nvdp.errors import MpsError
from nvdp.nvml import open_nvml
from nvdp.nvml.sim import SimNvml
from nvdp.nvml.types import ComputeMode
from tests.builders import sim_gpus
from tests.mps_standin import Standin
from tests.test_dra_slices import FACTS

GPUS = [g.uuid for g in sim_gpus("pcie-4")]


@pytest.fixture
def nvml() -> Iterator[SimNvml]:
    backend = open_nvml("sim:pcie-4")
    assert isinstance(backend, SimNvml)
    backend.init()
    yield backend
    backend.shutdown()


def test_one_daemon_per_gpu_set_from_first_holder_to_last(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = DraMps(tmp_path / "mps", nvml, standin.env())
    daemon = mps.ensure_daemon([GPUS[1]], holder="uid-a")
    assert daemon == MpsDaemon(
        GPUS[1], (GPUS[1],), tmp_path / "mps" / GPUS[1] / "pipe", tmp_path / "mps" / "shm"
    )
    assert mps.ensure_daemon([GPUS[1]], holder="uid-b") == daemon
    assert standin.running(daemon.pipe_dir)
    assert nvml.compute_modes[GPUS[1]] == ComputeMode.EXCLUSIVE_PROCESS
    assert {c["visible"] for c in standin.calls()} == {GPUS[1]}
    assert mps.holders() == {GPUS[1]: frozenset({"uid-a", "uid-b"})}
    mps.release("uid-a")
    assert standin.running(daemon.pipe_dir)
    mps.release("uid-b")
    assert not standin.running(daemon.pipe_dir)
    assert nvml.compute_modes[GPUS[1]] == ComputeMode.DEFAULT
    ready = "get_default_active_thread_percentage"
    assert standin.commands(daemon.pipe_dir) == ["-d", ready, ready, "quit"]
    assert mps.holders() == {}


def test_a_gpu_under_one_daemon_at_a_time(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = DraMps(tmp_path / "mps", nvml, standin.env())
    pair = mps.ensure_daemon([GPUS[0], GPUS[2]], holder="uid-a")
    assert pair.name == daemon_name([GPUS[2], GPUS[0]]) and pair.name.startswith("gpus-")
    assert {c["visible"] for c in standin.calls()} == {f"{GPUS[0]},{GPUS[2]}"}
    message = f"GPU {GPUS[2]} is under another MPS daemon ({pair.name})"
    with pytest.raises(MpsError, match=f"^{re.escape(message)}$"):
        mps.ensure_daemon([GPUS[2]], holder="uid-b")


def test_missing_binary_leaves_the_gpu_as_it_was(tmp_path: Path, nvml: SimNvml) -> None:
    mps = DraMps(tmp_path / "mps", nvml, {"PATH": str(tmp_path)})
    with pytest.raises(MpsError, match="^MPS: nvidia-cuda-mps-control not found on PATH$"):
        mps.ensure_daemon([GPUS[0]], holder="uid-a")
    assert nvml.compute_mode(GPUS[0]) == ComputeMode.DEFAULT
    assert mps.holders() == {}


def test_failed_start_restores_default(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    standin.fail_start(1)
    mps = DraMps(tmp_path / "mps", nvml, standin.env())
    with pytest.raises(MpsError, match=rf"^MPS daemon {GPUS[0]}: nvidia-cuda-mps-control: .* failed .*"):
        mps.ensure_daemon([GPUS[0]], holder="uid-a")
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.DEFAULT
    assert mps.ensure_daemon([GPUS[0]], holder="uid-a").gpus == (GPUS[0],)  # the next try starts it


def test_a_restarted_plugin_finds_its_daemons(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    daemon = DraMps(tmp_path / "mps", nvml, standin.env()).ensure_daemon([GPUS[3]], holder="uid-a")
    again = DraMps(tmp_path / "mps", nvml, standin.env())
    assert again.holders() == {GPUS[3]: frozenset({"uid-a"})}
    assert again.ensure_daemon([GPUS[3]], holder="uid-b") == daemon
    assert standin.commands(daemon.pipe_dir).count("-d") == 1, "the running daemon is kept"
    standin.kill_daemon(daemon.pipe_dir)  # it died meanwhile: the next holder starts it again
    again.ensure_daemon([GPUS[3]], holder="uid-c")
    assert standin.commands(daemon.pipe_dir).count("-d") == 2
    for holder in ("uid-a", "uid-b", "uid-c"):
        again.release(holder)
    assert not standin.running(daemon.pipe_dir)
    assert DraMps(tmp_path / "mps", nvml, standin.env()).holders() == {}


def test_client_edits(tmp_path: Path) -> None:
    daemon = MpsDaemon("gpus-x", ("GPU-a", "GPU-b"), tmp_path / "gpus-x" / "pipe", tmp_path / "shm")
    limits = ClientLimits(active_thread_percentage=40, pinned_memory={"GPU-b": 3 << 30, "GPU-z": 1 << 30})
    options = ["rw", "nosuid", "nodev", "bind"]
    assert client_edits(daemon, limits) == {
        "env": [
            f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=3072M",
        ],
        "mounts": [
            {"hostPath": str(daemon.pipe_dir), "containerPath": str(daemon.pipe_dir), "options": options},
            {"hostPath": str(tmp_path / "shm"), "containerPath": "/dev/shm", "options": options},
        ],
    }
    assert client_edits(daemon, ClientLimits())["env"] == [f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}"]


def test_a_gpu_shared_by_capacity_takes_no_configs_sharing(tmp_path: Path, nvml: SimNvml) -> None:
    gpu = replace(node_devices(sim_gpus("pcie-4"), FACTS)[0], allow_multiple_allocations=True)
    mps = DraMps(tmp_path / "mps", nvml, {"PATH": str(tmp_path)})
    sharing = ClaimSharing(tmp_path, nvml, mps, SimulatedTimeSlices())
    config = OpaqueConfig((), DeviceSharing("GpuConfig", "TimeSlicing", "Long"))
    message = (
        "ResourceClaim ns/c: a GpuConfig's sharing cannot apply to gpu-0: it is shared by capacity "
        "(each claim's share is enforced by MPS already)"
    )
    with pytest.raises(ClaimError, match=f"^{re.escape(message)}$"):
        sharing.apply(ClaimRef("ns", "c", "u"), [config], [Allocated("gpu", "gpu-0")], {"gpu-0": gpu})
    assert nvml.compute_mode(GPUS[0]) == ComputeMode.DEFAULT and sharing.shares() == {}


def test_stopped_with_the_plugin_and_resumed_at_its_start(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = DraMps(tmp_path / "mps", nvml, standin.env())
    daemon = mps.ensure_daemon([GPUS[0]], holder="uid-a")
    mps.stop()
    assert not standin.running(daemon.pipe_dir)
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.DEFAULT
    again = DraMps(tmp_path / "mps", nvml, standin.env())
    again.resume()
    assert standin.running(daemon.pipe_dir)
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.EXCLUSIVE_PROCESS
    assert again.holders() == {GPUS[0]: frozenset({"uid-a"})}
