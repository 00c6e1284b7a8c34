"""The real backend's NVML event set (nvmlEventSetCreate ... nvmlEventSetWait_v2), over pynvml."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nvdp.base.errors import NvmlError, nvml_error
from nvdp.node.nvml.types import EventType, NvmlEvent

if TYPE_CHECKING:
    from nvdp.node.nvml.real import RealNvml

logger = logging.getLogger(__name__)

_NO_INSTANCE = 0xFFFFFFFF


def _instance(value: int) -> int | None:
    return None if value == _NO_INSTANCE else int(value)


class RealEventSet:
    """An NVML event set (nvmlEventSetCreate). Owned by one thread."""

    def __init__(self, nvml: RealNvml) -> None:
        self._nvml = nvml
        self._handle = nvml._call("nvmlEventSetCreate")
        self._closed = False

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        device = self._nvml._handle(gpu_uuid)
        supported = self._nvml._optional("nvmlDeviceGetSupportedEventTypes", device, device=gpu_uuid) or 0
        wanted = EventType(int(event_types) & int(supported))
        if not wanted:
            raise nvml_error(
                "NVML_ERROR_NOT_SUPPORTED",
                "nvmlDeviceRegisterEvents",
                f"event types {event_types!r}",
                gpu_uuid,
            )
        self._nvml._call("nvmlDeviceRegisterEvents", device, int(wanted), self._handle, device=gpu_uuid)
        return wanted

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        name = "nvmlEventSetWait_v2" if hasattr(self._nvml._nv, "nvmlEventSetWait_v2") else "nvmlEventSetWait"
        self._nvml.waits_in_flight += 1
        try:
            data = self._nvml._call(name, self._handle, max(timeout_ms, 0))
        except NvmlError as e:
            if e.code == "NVML_ERROR_TIMEOUT":
                return None
            raise
        finally:
            self._nvml.waits_in_flight -= 1
        return NvmlEvent(
            gpu_uuid=self._nvml._uuid_of(data.device),
            event_type=EventType(int(data.eventType)),
            data=int(data.eventData),
            gi_id=_instance(int(data.gpuInstanceId)),
            ci_id=_instance(int(data.computeInstanceId)),
        )

    def interrupt(self) -> None:
        """nvmlEventSetWait cannot be ended early: the wait ends at its timeout."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml._call("nvmlEventSetFree", self._handle)
        except NvmlError as e:
            logger.warning("NVML event set free failed error=%r", str(e))
