"""The simulated node's event sets: events of the GPUs and types registered, delivered in order."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from nvdp.base.errors import nvml_error
from nvdp.node.nvml.types import EventType, NvmlEvent

if TYPE_CHECKING:
    from nvdp.node.nvml.sim.backend import SimNvml


class SimEventSet:
    """An event set of the simulated node: events of the GPUs and types registered, in order."""

    def __init__(self, backend: SimNvml) -> None:
        self._backend = backend
        self._cond = threading.Condition()
        self._events: deque[NvmlEvent] = deque()
        self._types: dict[str, EventType] = {}
        self._error: str | None = None
        self._closed = False
        self._interrupted = False
        self._stale = False  # the NVML session it belonged to was shut down

    def register(self, gpu_uuid: str, event_types: EventType) -> EventType:
        call = "nvmlDeviceRegisterEvents"
        self._check(call)
        supported = event_types & self._backend._supported_events(gpu_uuid)
        if not supported:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED", call, f"event types {event_types!r}", gpu_uuid)
        with self._cond:
            self._types[gpu_uuid] = self._types.get(gpu_uuid, EventType(0)) | supported
        return supported

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        call = "nvmlEventSetWait_v2"
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        with self._cond:
            while True:
                self._check(call)
                if self._error is not None:
                    code, self._error = self._error, None
                    raise nvml_error(code, call, "injected wait error")
                if self._events:
                    return self._events.popleft()
                if self._interrupted:
                    self._interrupted = False
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def interrupt(self) -> None:
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._events.clear()
            self._cond.notify_all()
        with self._backend._lock:
            self._backend._sets.discard(self)

    def _check(self, call: str) -> None:
        if self._closed:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT", call, "the event set is closed")
        if self._stale or not self._backend._initialized:
            raise nvml_error("NVML_ERROR_UNINITIALIZED", call, "NVML was shut down")

    def _offer(self, event: NvmlEvent) -> None:
        with self._cond:
            if event.event_type & self._types.get(event.gpu_uuid, EventType(0)):
                self._events.append(event)
                self._cond.notify_all()

    def _fail_next_wait(self, code: str) -> None:
        with self._cond:
            self._error = code
            self._cond.notify_all()

    def _invalidate(self) -> None:
        with self._cond:
            self._stale = True
            self._cond.notify_all()
