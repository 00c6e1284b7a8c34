"""Files that make large device sets: a 64-GPU simulated node, a time-slicing config."""

from __future__ import annotations

from pathlib import Path


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
