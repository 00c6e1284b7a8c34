"""`nvdp simulate --api dra`, as a user runs it: the published slice, claims allocated, prepared and
unprepared with their CDI edits, health changes printed with --serve, nothing left behind in /tmp."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from nvdp.testing import REPO, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.test_simulate import run_simulate


def test_the_dra_demo_on_a_mixed_mig_node(tmp_path: Path) -> None:
    result = run_simulate("--api", "dra", "--profile", "dgx-a100-mig", env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "registered: v1.DRAPlugin, health v1.DRAResourceHealth" in out
    assert "ResourceSlice sim-node-gpu.nvidia.com-0: driver gpu.nvidia.com, pool sim-node generation 1" in out
    assert ", 18 devices\n" in out
    assert "  gpu-2-mig-3g20gb-9-0     mig   3g.20gb                      19968Mi  MIG-" in out
    assert "  cudaComputeCapability           8.0.0\n" in out
    assert "  resource.kubernetes.io/pcieRoot pci0000:06\n" in out
    assert "ResourceClaim default/demo-gpu: one device of class gpu.nvidia.com" in out
    assert "  allocated gpu-4; NodePrepareResources -> k8s.gpu.nvidia.com/claim=" in out
    assert "/dev/nvidia4 -> /dev/nvidia4" in out and "env        NVIDIA_VISIBLE_DEVICES=void" in out
    assert "where device.attributes['gpu.nvidia.com'].profile == '1g.5gb'" in out
    assert "/dev/nvidia-caps/nvidia-cap66 -> /dev/nvidia-caps/nvidia-cap66" in out
    assert out.count("NodeUnprepareResources -> spec removed") == 2
    assert "Traceback" not in result.stderr
    assert not list(Path("/tmp").glob("nvdp-sim-*/plugins"))


def test_the_dra_demo_makes_and_destroys_a_mig_placement(tmp_path: Path) -> None:
    result = run_simulate("--api", "dra", "--profile", "dgx-a100-mig-empty", env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    sets = ", ".join(f"gpu-{n}-counter-set" for n in range(8))
    assert f"ResourceSlice sim-node-gpu.nvidia.com-0: the counter sets {sets}\n" in out
    assert "  gpu-0-mig-1g5gb-19-0     mig   1g.5gb                        4864Mi  (a MIG placement" in out
    assert "ResourceClaim default/demo-gpu" not in out  # no whole GPU on a MIG-mode node
    made = "  NVML, GPU 0: made MIG-"
    assert made in out and "; now 1x1g.5gb\n" in out
    assert "  allocated gpu-0-mig-1g5gb-19-0; NodePrepareResources -> k8s.gpu.nvidia.com/claim=" in out
    assert "/dev/nvidia-caps/nvidia-cap66 -> /dev/nvidia-caps/nvidia-cap66" in out
    mig = out.split(made)[1].split(";")[0]
    assert f"  NVML, GPU 0: destroyed MIG-{mig}; now MIG enabled, no MIG devices\n" in out
    assert "Traceback" not in result.stderr


def test_the_dra_demo_serves_and_prints_health_changes(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    gpu = sim_gpus("pcie-4")[2]
    out_path = tmp_path / "out.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvdp.cli", "simulate", "--api", "dra", "--profile", "pcie-4", "--serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "NVDP_SIM_EVENTS": str(events)},
        )
        try:
            wait_until(lambda: "Serving; health changes" in out_path.read_text(), 30, "serving line")
            append_sim_event(events, uuid=gpu.uuid, xid=79)
            wait_until(
                lambda: "gpu-2 -> Unhealthy XID 79" in out_path.read_text(), 15, "printed health change"
            )
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
