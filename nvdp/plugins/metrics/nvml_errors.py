"""Counting failed NVML calls: an Nvml (and its event sets) that reports each failure by NVML function
name, then re-raises. NOT_SUPPORTED is a capability answer, not a failure, and is not counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

from nvdp.base.errors import NvmlError, NvmlNotSupported
from nvdp.node.nvml.types import (
    ComputeMode,
    ComputeModes,
    EventSet,
    EventType,
    GpuFabric,
    GpuInfo,
    GpuLayout,
    GpuLink,
    Nvml,
    NvmlEvent,
    ProbeResult,
)

P = ParamSpec("P")
T = TypeVar("T")

ErrorCounter = Callable[[str], None]  # the failed NVML call's name, e.g. "nvmlEventSetWait_v2"


class CountingNvml:
    """`nvml` with every failed call passed to `count`."""

    def __init__(self, nvml: Nvml, count: ErrorCounter) -> None:
        self._nvml = nvml
        self._count = count

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except NvmlNotSupported:
            raise  # a capability answer, not a failure
        except NvmlError as error:
            self._count(error.call)
            raise

    def init(self) -> None:
        self.call(self._nvml.init)

    def shutdown(self) -> None:
        self.call(self._nvml.shutdown)

    def driver_version(self) -> str:
        return self.call(self._nvml.driver_version)

    def cuda_driver_version(self) -> str:
        return self.call(self._nvml.cuda_driver_version)

    def gpus(self) -> list[GpuInfo]:
        return self.call(self._nvml.gpus)

    def mig_layout(self) -> dict[str, GpuLayout]:
        return self.call(self._nvml.mig_layout)

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        return self.call(self._nvml.link, uuid_a, uuid_b)

    def create_event_set(self) -> EventSet:
        return _CountingEventSet(self.call(self._nvml.create_event_set), self)

    def probe(self, gpu_uuid: str) -> ProbeResult:
        return self.call(self._nvml.probe, gpu_uuid)

    def gpu_fabric(self, gpu_uuid: str) -> GpuFabric | None:
        return self.call(self._nvml.gpu_fabric, gpu_uuid)

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        return self.call(cast(ComputeModes, self._nvml).compute_mode, gpu_uuid)

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self.call(cast(ComputeModes, self._nvml).set_compute_mode, gpu_uuid, mode)

    def mig_control(self) -> object:  # the backend's (nvdp.plugins.dra.dynamic_mig.mig_control_of)
        make = getattr(self._nvml, "mig_control", None)
        return make() if callable(make) else None


class _CountingEventSet:
    def __init__(self, event_set: EventSet, nvml: CountingNvml) -> None:
        self._set = event_set
        self._nvml = nvml

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        return self._nvml.call(self._set.register, gpu_uuid, event_types)

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        return self._nvml.call(self._set.wait, timeout_ms)

    def interrupt(self) -> None:  # no NVML call: nothing to count
        self._set.interrupt()

    def close(self) -> None:
        self._nvml.call(self._set.close)
