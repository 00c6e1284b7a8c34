"""The stand-in `nvidia-cuda-mps-control` lives in `nvdp.testing.mps_control` (the benchmarks use it
too); the tests import it from here."""

from nvdp.testing.mps_control import Standin

__all__ = ["Standin"]
