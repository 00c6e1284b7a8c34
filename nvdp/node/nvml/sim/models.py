"""GPU models the simulated node knows, so that a node file can name a GPU and omit its facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuModel:
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_slices: int = 0  # compute slices when MIG capable; 0: not MIG capable
    nvswitch_links: int = 0  # NVLinks from one GPU into the NVSwitch fabric of its HGX board
    mig_memory_mib: Mapping[int, int] = field(default_factory=dict)  # memory slices -> MiB


MODELS: Mapping[str, GpuModel] = {
    "NVIDIA A100-SXM4-40GB": GpuModel(40960, (8, 0), 7, 12, {1: 4864, 2: 9984, 4: 19968, 8: 40192}),
    "NVIDIA A100-SXM4-80GB": GpuModel(81920, (8, 0), 7, 12),
    "NVIDIA A30": GpuModel(24576, (8, 0), 4),
    "NVIDIA H100 80GB HBM3": GpuModel(81559, (9, 0), 7, 18),
    "NVIDIA H200": GpuModel(143771, (9, 0), 7, 18),
    "NVIDIA GB200": GpuModel(189471, (10, 0), 7, 18),
    "NVIDIA L40S": GpuModel(46068, (8, 9)),
    "Tesla T4": GpuModel(15360, (7, 5)),
}
