"""Simulated nodes for the tests and the benchmarks: files that make large device sets (a 64-GPU
node, a time-slicing config), the GPUs of a built-in node and the events fed to it."""

from __future__ import annotations

import json
from pathlib import Path

from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuInfo


def write_node_file(path: Path, gpus: int = 64) -> Path:
    """A simulated node of `gpus` H100s on 4 NUMA nodes, every pair joined by 18 NVLinks (NVSwitch)."""
    path.write_text(
        f"# {gpus} simulated GPUs for the benchmarks and soak tests\n"
        "gpus:\n"
        f"  - {{name: NVIDIA H100 80GB HBM3, count: {gpus}, numa_nodes: 4}}\n"
        "nvswitch: 18\n"
    )
    return path


def write_time_slicing_config(path: Path, replicas: int = 64, extra: str = "") -> Path:
    """A v1 config: every GPU shared `replicas` ways by time-slicing (8 x 64 = 512 devices on dgx-a100)."""
    path.write_text(
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}\n" + extra
    )
    return path


def sim_gpus(profile: str = "dgx-a100") -> list[GpuInfo]:
    """The GPUs of a built-in simulated node (`sim:<profile>`), as the plugin under test sees them."""
    nvml = open_nvml(f"sim:{profile}")
    nvml.init()
    try:
        return nvml.gpus()
    finally:
        nvml.shutdown()


def append_sim_event(events: Path, **event: object) -> None:
    """Append one line to the simulated node's events file (NVDP_SIM_EVENTS), which it applies:
    `uuid=..., xid=79`, `event="gpu-lost"`, `mig=[...]`; `**{"compute-mode": ...}`."""
    with events.open("a") as f:
        f.write(json.dumps(event) + "\n")
