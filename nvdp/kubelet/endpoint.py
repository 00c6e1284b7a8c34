"""The kubelet's connection to one registered plugin: one channel, its stub, the ListAndWatch stream."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from nvdp.api import pb, pb_grpc

log = logging.getLogger(__name__)


class StreamEnd(NamedTuple):
    """How one ListAndWatch stream ended."""

    time: float  # time.monotonic() when the kubelet saw the end
    endpoint: str
    code: grpc.StatusCode  # OK: the plugin finished the stream itself
    details: str
    by_kubelet: bool  # True when the kubelet closed it (re-registration, restart, stop)


UpdateHandler = Callable[["PluginEndpoint", "pb.ListAndWatchResponse", float], None]
EndHandler = Callable[["PluginEndpoint", StreamEnd], None]


class PluginEndpoint:
    """Dial with `connect`, stream with `watch`, `close` when done. The handlers run on the stream thread.

    Like the kubelet, a stream that ends on its own closes the channel: the plugin has to register again.
    """

    def __init__(
        self, resource: str, socket_path: Path, on_update: UpdateHandler, on_end: EndHandler
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub: Any = pb_grpc.DevicePluginStub(self._channel)
        self._on_update = on_update
        self._on_end = on_end
        self._lock = threading.Lock()
        self._closed = False
        self._call: Any = None
        self._thread: threading.Thread | None = None

    def connect(self, timeout: float) -> pb.DevicePluginOptions:
        """Wait until the plugin answers (the kubelet's blocking dial), then ask for its options."""
        options: pb.DevicePluginOptions = self.stub.GetDevicePluginOptions(
            pb.Empty(), timeout=timeout, wait_for_ready=True
        )
        return options

    def watch(self) -> None:
        """Open ListAndWatch and receive it on a thread (no-op once closed)."""
        with self._lock:
            if self._closed or self._thread is not None:
                return
            self._call = self.stub.ListAndWatch(pb.Empty())
            self._thread = threading.Thread(
                target=self._receive, name=f"kubelet-listandwatch-{self.resource}", daemon=True
            )
            self._thread.start()

    def _receive(self) -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            for response in self._call:
                self._on_update(self, response, time.monotonic())
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
        with self._lock:
            by_kubelet, self._closed = self._closed, True
        if not by_kubelet:
            self._channel.close()
        self._on_end(self, StreamEnd(time.monotonic(), self.socket_path.name, code, details, by_kubelet))

    def close(self) -> None:
        """Cancel the stream and close the channel; idempotent, does not wait for the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._channel.close()

    def join(self, timeout: float = 5.0) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("ListAndWatch thread did not stop resource=%s", self.resource)
