"""`nvdp simulate`, the README's first command, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO, wait_until
from tests.builders import append_sim_event, sim_gpus


def run_simulate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_default_prints_eight_gpus_and_an_allocation() -> None:
    result = run_simulate()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "node sim:dgx-a100" in out
    assert "nvidia.com/gpu                  8 devices  socket nvidia-gpu.sock" in out
    devices, _, ledger = out.partition("\nPod default/simulate-demo admitted; the allocation ledger after it")
    assert devices.count("NVIDIA A100-SXM4-40GB") == 8 and devices.count("Healthy") == 8
    assert "GetPreferredAllocation nvidia.com/gpu: 4 of 8 available" in devices
    assert "GPU index 0, 1, 2, 3; NUMA node 0; 12 NVLinks between every pair" in devices
    assert "env        NVIDIA_VISIBLE_DEVICES=GPU-" in devices
    # the ledger after that Allocate, read from the kubelet stand-in's PodResources API
    chosen = devices.split("  -> ")[1].split("\n")[0].split(", ")
    assert "nvidia.com/gpu  8 devices: 4 held, 0 not healthy, 4 free" in ledger
    held = [line.split() for line in ledger.splitlines() if line.endswith("default/simulate-demo (main)")]
    assert [(row[0], row[1], row[2]) for row in held] == [
        (i, str(n), "Healthy") for n, i in enumerate(chosen)
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ("--profile", "pcie-4"), "GPU index 0, 1; NUMA node 0; 4 NVLinks between every pair", id="pcie-4"
        ),
        pytest.param(
            ("--profile", "dgx-a100-mig", "--mig-strategy", "mixed"), "nvidia.com/mig-1g.5gb", id="mig"
        ),
        pytest.param(
            ("--profile", "dgx-h100", "--device-id-strategy", "index"),
            "NVIDIA_VISIBLE_DEVICES=0,1,2,3",
            id="h100-index",
        ),
    ],
)
def test_profiles_and_flags(args: tuple[str, ...], expected: str) -> None:
    result = run_simulate(*args)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_bad_input_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("version: v2\n")
    result = run_simulate("--config-file", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "version" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_that_does_not_fit_the_strategy_is_served_with_one_warning_per_misfit() -> None:
    result = run_simulate("--profile", "dgx-a100-mig", "--mig-strategy", "single")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert [w.rsplit(" reason=", 1)[1] for w in warnings] == ["MigModeMixed", "MigProfilesMixed"]
    assert (
        "more than one MIG profile on the node (1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb); serving 1g.5gb"
        in (warnings[1])
    )
    assert "nvidia.com/gpu                  8 devices" in result.stdout
    assert "Traceback" not in result.stderr


def test_serve_prints_injected_health_changes(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    gpu = sim_gpus("dgx-a100")[6]
    out_path = tmp_path / "out.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvdp.cli", "simulate", "--serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "NVDP_SIM_EVENTS": str(events)},
        )
        try:
            wait_until(
                lambda: "Serving; health changes" in out_path.read_text(), timeout=30, what="serving line"
            )
            append_sim_event(events, uuid=gpu.uuid, xid=79)
            wait_until(
                lambda: f"{gpu.uuid} -> Unhealthy" in out_path.read_text(),
                timeout=15,
                what="printed health change",
            )
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
