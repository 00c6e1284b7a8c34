"""`nvdp simulate --api dra`, as a user runs it: the published slice, claims allocated, prepared and
unprepared with their CDI edits, health changes printed with --serve, nothing left behind in /tmp."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from testkit import REPO, wait_until
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


def test_the_dra_demo_shows_a_gpu_shared_by_three_claims(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\ndra:\n  devices: all\n  consumableCapacity: [0]\n")
    result = run_simulate("--api", "dra", "--config-file", str(config), env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    gpu0 = sim_gpus("dgx-a100")[0].uuid
    assert "gpu-0 is shared by capacity (allowMultipleAllocations: true):\n" in out
    assert "  memory     40Gi  default 1Gi, min 1Gi, step 1Gi\n" in out
    assert "  allocated gpu-0: consumedCapacity compute 50, memory 10Gi; shareID " in out
    limits = [line.strip() for line in out.splitlines() if "CUDA_MPS_PINNED" in line or "THREAD_PERC" in line]
    assert limits == [
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={gpu0}=10240M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={gpu0}=2048M",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={gpu0}=1024M",
    ]
    assert (
        "  not allocated: request gpu: 1 device(s) of class gpu.nvidia.com wanted, 0 free on node sim-node "
        "match with memory 30Gi to spare\n"
    ) in out
    assert "NodeUnprepareResources of the 3 shares -> their specs removed" in out
    pipes = {ln.strip().partition("=")[2] for ln in out.splitlines() if "CUDA_MPS_PIPE_DIRECTORY=" in ln}
    assert len(pipes) == 1 and pipes.pop().startswith("/tmp/nvdp-sim-")  # the run's: not /run/nvidia/mps
    assert "Traceback" not in result.stderr
