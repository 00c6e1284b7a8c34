"""Compute modes behind the MPS control daemon's back: the simulated node's `compute-mode` event line
(NVDP_SIM_EVENTS), and the daemon setting EXCLUSIVE_PROCESS again on its next health check (a driver
reload or `nvidia-smi -c` resets it; processes outside MPS could then use the GPU beside its
clients)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from nvdp.node.mps.layout import MpsRoot
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim import SimEventError, SimNvml
from nvdp.node.nvml.types import ComputeMode
from testkit import Process, clean_env, wait_until
from tests import test_mps_daemon
from tests.builders import append_sim_event, sim_gpus
from tests.mps_standin import Standin
from tests.test_mps_daemon import MPS4, Running

running = test_mps_daemon.running  # the in-process controller against the stand-in, by name
GPU = "nvidia.com/gpu"


def test_compute_mode_event_line() -> None:
    nvml = open_nvml("sim:dgx-a100-mig")
    assert isinstance(nvml, SimNvml)
    nvml.init()
    try:
        gpu = nvml.gpus()[0]
        assert nvml.compute_mode(gpu.uuid) == ComputeMode.DEFAULT
        nvml.inject(json.dumps({"uuid": gpu.uuid, "compute-mode": "PROHIBITED"}))
        assert nvml.compute_mode(gpu.uuid) == ComputeMode.PROHIBITED
        nvml.inject({"uuid": gpu.uuid, "compute-mode": "EXCLUSIVE_PROCESS"})
        assert nvml.compute_mode(gpu.uuid) == ComputeMode.EXCLUSIVE_PROCESS
        for event, reason in [
            (
                {"uuid": gpu.uuid, "compute-mode": "SHARED"},
                "compute-mode: must be one of DEFAULT, EXCLUSIVE_THREAD, PROHIBITED, EXCLUSIVE_PROCESS, "
                "got 'SHARED'",
            ),
            (
                {"uuid": gpu.mig_devices[0].uuid, "compute-mode": "DEFAULT"},
                "compute-mode: a GPU's setting; name the GPU, not a MIG device",
            ),
            (
                {"uuid": gpu.uuid, "compute-mode": "DEFAULT", "xid": 79},
                "needs exactly one of 'xid', 'event', 'mig' or 'compute-mode'",
            ),
        ]:
            with pytest.raises(SimEventError, match=f"^{re.escape(reason)}$"):
                nvml.inject(event)
        assert nvml.compute_mode(gpu.uuid) == ComputeMode.EXCLUSIVE_PROCESS
    finally:
        nvml.shutdown()


def test_health_check_restores_exclusive_process(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    gpu0 = sim_gpus("pcie-4")[0].uuid
    running.nvml.inject({"uuid": gpu0, "compute-mode": "DEFAULT"})
    wait_until(
        lambda: running.nvml.compute_modes[gpu0] == ComputeMode.EXCLUSIVE_PROCESS,
        timeout=10,
        what="EXCLUSIVE_PROCESS again",
    )
    assert "compute mode changed behind the MPS daemon; restoring EXCLUSIVE_PROCESS" in caplog.text
    assert running.root.marker(GPU).exists(), "the daemon itself is fine: it stays ready"


def test_daemon_process_follows_the_events_file(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    events = tmp_path / "events.jsonl"
    events.touch()
    root = MpsRoot(tmp_path / "mps")
    argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
    argv += ["--config-file", str(config), "--mps-root", str(root.path), "--mps-health-interval", "100ms"]
    env = standin.env(clean_env({"NVDP_SIM_EVENTS": str(events)}))
    process = Process(argv, tmp_path / "daemon.log", env)
    try:
        wait_until(lambda: root.marker(GPU).exists(), timeout=20, what="ready marker")
        gpu1 = sim_gpus("pcie-4")[1].uuid
        append_sim_event(events, **{"uuid": gpu1, "compute-mode": "DEFAULT"})
        wait_until(lambda: "restoring EXCLUSIVE_PROCESS" in process.log(), timeout=10, what="restore")
    finally:
        process.stop()
    log = process.log()
    assert f"simulated compute mode changed gpu={gpu1} mode=DEFAULT" in log
    assert f"gpu={gpu1} mode=DEFAULT" in log.split("restoring EXCLUSIVE_PROCESS", 1)[1].splitlines()[0]
    assert "Traceback" not in log
