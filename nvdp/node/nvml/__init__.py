"""NVML for nvdp: the typed facade (`nvdp.node.nvml.types`) and `open_nvml` to pick a backend.

Backends are imported lazily: importing this package loads neither pynvml nor the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvdp.base.errors import ConfigError
from nvdp.base.errors import (
    nvml_error as nvml_error,  # defined in nvdp.base.errors (backends import it there)
)
from nvdp.node.nvml.types import (
    EventSet,
    EventType,
    FabricState,
    GpuFabric,
    GpuInfo,
    GpuLink,
    MigDeviceInfo,
    Nvml,
    NvmlEvent,
    PcieLevel,
    ProbeResult,
)

__all__ = [
    "EventSet",
    "EventType",
    "FabricState",
    "GpuFabric",
    "GpuInfo",
    "GpuLink",
    "MigDeviceInfo",
    "Nvml",
    "NvmlEvent",
    "PcieLevel",
    "ProbeResult",
    "SIM_EVENTS_ENV",
    "nvml_error",
    "open_nvml",
]

SIM_EVENTS_ENV = "NVDP_SIM_EVENTS"


def open_nvml(
    spec: str,
    driver_root: str = "/",
    container_driver_root: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Nvml:
    """Open (not init) an NVML backend: "real", "sim:NAME" (built-in node) or "sim:/path/node.yaml".

    The real backend looks for libnvidia-ml.so.1 under `container_driver_root`, then `driver_root`,
    then by the default search (see `nvdp.node.nvml.library`).

    The simulated backend follows the file named by NVDP_SIM_EVENTS in `environ` (the process
    environment, passed in by the entry point; none: no events file) for fault injection.
    Raises ConfigError for an unknown spec, profile or an invalid node file.
    """
    if spec == "real":
        from nvdp.node.nvml.real import RealNvml

        return RealNvml(driver_root=driver_root, container_driver_root=container_driver_root)
    if spec.startswith("sim:") and spec[4:]:
        from nvdp.node.nvml.sim import open_sim

        return open_sim(spec[4:], events_path=(environ or {}).get(SIM_EVENTS_ENV) or None)
    raise ConfigError(f"--nvml: unknown backend {spec!r}; accepted: real, sim:NAME, sim:/path/to/node.yaml")
