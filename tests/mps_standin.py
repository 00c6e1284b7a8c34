"""The stand-in `nvidia-cuda-mps-control` lives in `testkit.mps_control` (the benchmarks use it
too); the tests import it from here."""

from testkit.mps_control import Standin

__all__ = ["Standin"]
