"""The simulated node as the tests see it."""

from __future__ import annotations

from nvdp.nvml import open_nvml
from nvdp.nvml.types import GpuInfo


def sim_gpus(profile: str) -> list[GpuInfo]:
    """The GPUs of a built-in simulated node, as the plugin under test will see them."""
    nvml = open_nvml(f"sim:{profile}")
    nvml.init()
    try:
        return nvml.gpus()
    finally:
        nvml.shutdown()
