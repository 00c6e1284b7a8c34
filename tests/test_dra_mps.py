"""The DRA plugin's MPS daemons (`nvdp.plugins.dra.mps`, for claims' configs and capacity shares alike)
against the `nvidia-cuda-mps-control` stand-in and the simulated node: one daemon per GPU set, started
at the first holder and stopped after the last, its GPUs EXCLUSIVE_PROCESS meanwhile, no control
command for a holder while it is ready, found again by a restarted plugin, started again by its
controller when it no longer answers; holders records that cannot be trusted; the clients' CDI edits;
no config's sharing on a GPU shared by capacity."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.errors import MpsError
from nvdp.base.logs import FIELDS_ATTR
from nvdp.node.mps.layout import MpsRoot
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim import SimNvml
from nvdp.node.nvml.types import ComputeMode
from nvdp.plugins.dra.claim_sharing import TIMESLICES_FILE, ClaimSharing
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.mps import HOLDERS_FILE, ClientLimits, DraMps, MpsDaemon, client_edits, daemon_name
from nvdp.plugins.dra.sharing import DeviceSharing, OpaqueConfig
from nvdp.plugins.dra.timeslice import SimulatedTimeSlices
from testkit import wait_until
from tests.builders import sim_gpus
from tests.mps_standin import Standin
from tests.test_dra_slices import FACTS

GPUS = [g.uuid for g in sim_gpus("pcie-4")]
READY = "get_default_active_thread_percentage"
OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]


@pytest.fixture
def nvml() -> Iterator[SimNvml]:
    backend = open_nvml("sim:pcie-4")
    assert isinstance(backend, SimNvml)
    backend.init()
    yield backend
    backend.shutdown()


def dra_mps(tmp_path: Path, nvml: SimNvml, env: dict[str, str], **kwargs: Any) -> DraMps:
    return DraMps(MpsRoot(tmp_path / "mps"), nvml, env, **kwargs)


def daemon_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "mps" / "gpu.nvidia.com" / name


def test_one_daemon_per_gpu_set_from_first_holder_to_last(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = dra_mps(tmp_path, nvml, standin.env(), health_interval=3600)  # no health query meanwhile
    daemon = mps.ensure_daemon([GPUS[1]], holder="uid-a")
    assert daemon == MpsDaemon(
        GPUS[1], (GPUS[1],), daemon_dir(tmp_path, GPUS[1]) / "pipe", tmp_path / "mps/shm"
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
    # the second holder ran no control command: the daemon was ready
    assert standin.commands(daemon.pipe_dir) == ["-d", "set_default_active_thread_percentage 100", "quit"]
    assert mps.holders() == {}
    record = json.loads((daemon_dir(tmp_path, GPUS[1]) / HOLDERS_FILE).read_text())
    assert record == {"gpus": [GPUS[1]], "holders": [], "kept": False}


def test_a_gpu_under_one_daemon_at_a_time(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = dra_mps(tmp_path, nvml, standin.env())
    pair = mps.ensure_daemon([GPUS[0], GPUS[2]], holder="uid-a")
    assert pair.name == daemon_name([GPUS[2], GPUS[0]]) and pair.name.startswith("gpus-")
    assert {c["visible"] for c in standin.calls()} == {f"{GPUS[0]},{GPUS[2]}"}
    message = f"GPU {GPUS[2]} is under another MPS daemon ({pair.name})"
    with pytest.raises(MpsError, match=f"^{re.escape(message)}$"):
        mps.ensure_daemon([GPUS[2]], holder="uid-b")
    mps.stop()


def test_missing_binary_leaves_the_gpu_as_it_was(tmp_path: Path, nvml: SimNvml) -> None:
    mps = dra_mps(tmp_path, nvml, {"PATH": str(tmp_path)})
    message = f"MPS daemon {GPUS[0]} is not ready: nvidia-cuda-mps-control not found"
    with pytest.raises(MpsError, match=f"^{re.escape(message)}$"):
        mps.ensure_daemon([GPUS[0]], holder="uid-a")
    assert nvml.compute_mode(GPUS[0]) == ComputeMode.DEFAULT
    assert mps.holders() == {}


def test_failed_start_restores_default(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    standin.fail_start(1)
    mps = dra_mps(tmp_path, nvml, standin.env())
    with pytest.raises(
        MpsError, match=rf"^MPS daemon {GPUS[0]} is not ready: MPS daemon failed to start: .*"
    ):
        mps.ensure_daemon([GPUS[0]], holder="uid-a")
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.DEFAULT
    assert mps.ensure_daemon([GPUS[0]], holder="uid-a").gpus == (GPUS[0],)  # the next try starts it
    mps.stop()


def test_a_daemon_that_stops_answering_is_started_again(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    mps = dra_mps(tmp_path, nvml, standin.env(), health_interval=0.05)
    daemon = mps.ensure_daemon([GPUS[3]], holder="uid-a")
    standin.kill_daemon(daemon.pipe_dir)  # it died: its controller's health query sees it
    wait_until(lambda: standin.commands(daemon.pipe_dir).count("-d") == 2, 10, "a second start")
    assert mps.ensure_daemon([GPUS[3]], holder="uid-b") == daemon
    assert standin.running(daemon.pipe_dir)
    mps.stop()


def test_a_restarted_plugin_finds_its_daemons(tmp_path: Path, nvml: SimNvml) -> None:
    standin = Standin(tmp_path / "standin")
    first = dra_mps(tmp_path, nvml, standin.env(), health_interval=3600)  # as if gone: it never looks again
    daemon = first.ensure_daemon([GPUS[3]], holder="uid-a")
    again = dra_mps(tmp_path, nvml, standin.env())  # the first one ended without its stop (a crash)
    assert again.holders() == {GPUS[3]: frozenset({"uid-a"})}
    assert again.ensure_daemon([GPUS[3]], holder="uid-b") == daemon
    assert standin.running(daemon.pipe_dir), "the running daemon is kept"
    assert "quit" not in standin.commands(daemon.pipe_dir)
    for holder in ("uid-a", "uid-b"):
        again.release(holder)
    assert not standin.running(daemon.pipe_dir)
    assert dra_mps(tmp_path, nvml, standin.env()).holders() == {}


@pytest.mark.parametrize(
    "record",
    [
        "{not json",
        json.dumps({"gpus": ["GPU-other"], "holders": ["a"]}),
        json.dumps({"gpus": [], "holders": []}),
        json.dumps({"gpus": [GPUS[2]], "holders": ["../x"]}),
        json.dumps({"gpus": [GPUS[2]], "holders": ["a"] * 2000}),
        '{"gpus": ' + "[" * 5000 + "]" * 5000 + "}",  # deeper than Python's recursion limit
        None,
    ],
    ids=["not-json", "not-its-devices", "no-device", "odd-holder", "too-many", "nested", "missing"],
)
def test_a_record_not_trusted_never_stops_the_daemon(
    tmp_path: Path, nvml: SimNvml, record: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    standin = Standin(tmp_path / "standin")
    crashed = dra_mps(tmp_path, nvml, standin.env(), health_interval=3600)  # as if gone: it never looks again
    daemon = crashed.ensure_daemon([GPUS[2]], holder="uid-a")
    path = daemon_dir(tmp_path, GPUS[2]) / HOLDERS_FILE
    if record is None:
        path.unlink()
    else:
        path.write_text(record)
    again = dra_mps(tmp_path, nvml, standin.env())
    assert again.holders() == {}
    again.ensure_daemon([GPUS[2]], holder="uid-b")
    assert [r.levelname for r in caplog.records if r.levelname != "INFO"] == ["WARNING"]
    again.release("uid-b")
    assert standin.running(daemon.pipe_dir), "who else uses it is unknown"
    assert json.loads(path.read_text())["kept"] is True
    assert dra_mps(tmp_path, nvml, standin.env()).holders() == {}
    again.stop()
    assert not standin.running(daemon.pipe_dir)


def test_a_linked_record_is_not_read(tmp_path: Path, nvml: SimNvml) -> None:
    (tmp_path / "elsewhere.json").write_text(json.dumps({"gpus": [GPUS[1]], "holders": ["uid-a"]}))
    directory = daemon_dir(tmp_path, GPUS[1])
    directory.mkdir(parents=True)
    (directory / HOLDERS_FILE).symlink_to(tmp_path / "elsewhere.json")
    assert dra_mps(tmp_path, nvml, {}).holders() == {}


def test_client_edits(tmp_path: Path) -> None:
    daemon = MpsDaemon("gpus-x", ("GPU-a", "GPU-b"), tmp_path / "gpus-x" / "pipe", tmp_path / "shm")
    limits = ClientLimits(active_thread_percentage=40, pinned_memory={"GPU-b": 3 << 30, "GPU-z": 1 << 30})
    assert client_edits(daemon, limits) == {
        "env": [
            f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-b=3072M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
        ],
        "mounts": [
            {"hostPath": str(daemon.pipe_dir), "containerPath": str(daemon.pipe_dir), "options": OPTIONS},
            {"hostPath": str(tmp_path / "shm"), "containerPath": "/dev/shm", "options": OPTIONS},
        ],
    }
    both = ClientLimits(pinned_memory={"GPU-a": 1 << 30, "GPU-b": 2 << 30})
    assert client_edits(daemon, both)["env"][1] == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=1024M,GPU-b=2048M"
    assert client_edits(daemon, ClientLimits())["env"] == [f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}"]


def test_a_gpu_shared_by_capacity_takes_no_configs_sharing(tmp_path: Path, nvml: SimNvml) -> None:
    gpu = replace(node_devices(sim_gpus("pcie-4"), FACTS)[0], allow_multiple_allocations=True)
    mps = dra_mps(tmp_path, nvml, {"PATH": str(tmp_path)})
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
    mps = dra_mps(tmp_path, nvml, standin.env())
    daemon = mps.ensure_daemon([GPUS[0]], holder="uid-a")
    mps.stop()
    assert not standin.running(daemon.pipe_dir)
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.DEFAULT
    with pytest.raises(MpsError, match="^MPS: the plugin is stopping$"):
        mps.ensure_daemon([GPUS[0]], holder="uid-b")
    again = dra_mps(tmp_path, nvml, standin.env())
    again.resume({"uid-a"})
    wait_until(lambda: standin.running(daemon.pipe_dir), 10, "the daemon started again")
    wait_until(lambda: nvml.compute_modes[GPUS[0]] == ComputeMode.EXCLUSIVE_PROCESS, 10, "exclusive")
    assert again.holders() == {GPUS[0]: frozenset({"uid-a"})}
    again.stop()


def test_a_holder_no_claim_is_prepared_for_is_dropped_at_resume(
    tmp_path: Path, nvml: SimNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """A holders record that outlived its claims (the checkpoint, read or rebuilt, does not list
    them) starts no daemon and makes no GPU exclusive; a daemon other claims still hold resumes
    for those alone."""
    standin = Standin(tmp_path / "standin")
    mps = dra_mps(tmp_path, nvml, standin.env())
    gone = mps.ensure_daemon([GPUS[0]], holder="uid-gone")
    kept = mps.ensure_daemon([GPUS[1]], holder="uid-kept")
    mps.ensure_daemon([GPUS[1]], holder="uid-gone-too")
    mps.stop()
    again = dra_mps(tmp_path, nvml, standin.env())
    with caplog.at_level(logging.WARNING):
        again.resume({"uid-kept", "uid-other"})
    wait_until(lambda: standin.running(kept.pipe_dir), 10, "the held daemon started again")
    assert again.holders() == {GPUS[1]: frozenset({"uid-kept"})}
    assert not standin.running(gone.pipe_dir)
    assert nvml.compute_modes[GPUS[0]] == ComputeMode.DEFAULT
    assert json.loads((daemon_dir(tmp_path, GPUS[0]) / "holders.json").read_text())["holders"] == []
    said = [
        r
        for r in caplog.records
        if r.getMessage() == "MPS holders record names claims not prepared here; dropped"
    ]
    assert sorted(getattr(r, FIELDS_ATTR)["claims"] for r in said) == ["uid-gone", "uid-gone-too"]
    again.stop()


def test_a_simulated_node_marks_its_daemons_ready(tmp_path: Path, nvml: SimNvml) -> None:
    mps = dra_mps(tmp_path, nvml, {"PATH": str(tmp_path)}, simulated=True)
    mps.ensure_daemon([GPUS[0]], holder="uid-a")
    marker = daemon_dir(tmp_path, GPUS[0]) / ".started"
    assert marker.exists() and nvml.compute_mode(GPUS[0]) == ComputeMode.DEFAULT
    mps.release("uid-a")
    assert not marker.exists()


@pytest.mark.parametrize(
    "text", ["{not json", '{"a": ' + "[" * 5000 + "]" * 5000 + "}"], ids=["not-json", "nested"]
)
def test_an_unreadable_time_slices_record_is_empty(
    tmp_path: Path, nvml: SimNvml, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / TIMESLICES_FILE).write_text(text)
    mps = dra_mps(tmp_path, nvml, {"PATH": str(tmp_path)})
    with caplog.at_level(logging.WARNING):
        ClaimSharing(tmp_path, nvml, mps, SimulatedTimeSlices())
    assert [r.getMessage() for r in caplog.records] == ["unreadable time-sliced GPUs; ignored"]
