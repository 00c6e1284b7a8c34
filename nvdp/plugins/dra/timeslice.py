"""A GPU's time-slice interval, set as NVIDIA's DRA driver sets it (NVML has no call for it).

- `nvidia-smi compute-policy -i <uuid> --set-timeslice <level>`: Default 0, Short 1, Medium 2, Long 3.
- `NvidiaSmi` runs the driver root's nvidia-smi (as this container sees the root; else the one on
  PATH) with its libnvidia-ml.so.1 preloaded, each run bounded by a timeout.
- A simulated node has no nvidia-smi: `SimulatedTimeSlices` keeps the levels and logs each one
  (`simulated time slice set gpu=... interval=Short smi_level=1`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Mapping
from typing import Protocol

from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event
from nvdp.node.cdi.roots import inside
from nvdp.node.cdi.scan import BINARY_DIRS
from nvdp.node.nvml.library import LIBRARY_DIRS
from nvdp.plugins.dra.sharing import INTERVALS as LEVELS

log = logging.getLogger(__name__)

NVIDIA_SMI = "nvidia-smi"
NVML_LIBRARY = "libnvidia-ml.so.1"
RUN_TIMEOUT_S = 30.0


class TimeSliceError(NvdpError):
    """A time-slice interval could not be set (one line)."""


class TimeSlicer(Protocol):
    def set_timeslice(self, gpu_uuid: str, interval: str) -> None:
        """Set the GPU's interval (a key of LEVELS). Raises TimeSliceError."""
        ...


class NvidiaSmi:
    def __init__(self, binary: str, environ: Mapping[str, str], *, timeout: float = RUN_TIMEOUT_S) -> None:
        self.binary = binary
        self._env = dict(environ)
        self._timeout = timeout

    @classmethod
    def of_root(cls, driver_here: str, environ: Mapping[str, str]) -> NvidiaSmi:
        """nvidia-smi of the driver root as seen here (`nvdp.node.cdi.roots.visible_roots`), with its
        libnvidia-ml.so.1 preloaded; the one on PATH when the root has none."""
        found = [inside(driver_here, f"{d}/{NVIDIA_SMI}") for d in BINARY_DIRS]
        binary = next((p for p in found if os.access(p, os.X_OK)), NVIDIA_SMI)
        env = dict(environ)
        library = next(
            (p for d in LIBRARY_DIRS if os.path.exists(p := inside(driver_here, f"/{d}/{NVML_LIBRARY}"))),
            None,
        )
        if library is not None and binary != NVIDIA_SMI:
            env["LD_PRELOAD"] = ":".join(filter(None, (library, env.get("LD_PRELOAD"))))
        return cls(binary, env)

    def set_timeslice(self, gpu_uuid: str, interval: str) -> None:
        argv = [self.binary, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(LEVELS[interval])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=self._env, timeout=self._timeout)
        except subprocess.TimeoutExpired:
            raise TimeSliceError(
                f"{NVIDIA_SMI} compute-policy: did not finish within {self._timeout:g}s"
            ) from None
        except OSError as error:
            raise TimeSliceError(
                f"{NVIDIA_SMI} compute-policy: cannot run {self.binary}: {error.strerror}"
            ) from None
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            why = lines[-1] if lines else f"exit status {done.returncode}"
            raise TimeSliceError(f"{NVIDIA_SMI} compute-policy -i {gpu_uuid}: {why}")
        log_event(
            log, logging.INFO, "time slice set", gpu=gpu_uuid, interval=interval, smi_level=LEVELS[interval]
        )


class SimulatedTimeSlices:
    """The simulated node's: the levels set, by GPU UUID."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.levels: dict[str, int] = {}

    def set_timeslice(self, gpu_uuid: str, interval: str) -> None:
        with self._lock:
            self.levels[gpu_uuid] = LEVELS[interval]
        log_event(
            log,
            logging.INFO,
            "simulated time slice set",
            gpu=gpu_uuid,
            interval=interval,
            smi_level=LEVELS[interval],
        )
