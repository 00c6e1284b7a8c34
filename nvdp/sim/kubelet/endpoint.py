"""The kubelet's connection to one registered plugin: one channel, its stub, the ListAndWatch stream.

What the stream brings is handed to a `ListAndWatchReceiver` (the kubelet's
PluginListAndWatchReceiver / PluginDisconnected), so this module holds no device state.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

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


class ListAndWatchReceiver(Protocol):
    """Where a plugin's stream goes; called on the stream's thread."""

    def list_and_watch_received(
        self, plugin: PluginEndpoint, response: pb.ListAndWatchResponse, received: float
    ) -> None: ...

    def plugin_disconnected(self, plugin: PluginEndpoint, end: StreamEnd) -> None: ...


class PluginEndpoint:
    """Dial with `connect`, stream with `watch`, `close` when done.

    Like the kubelet, a stream that ends on its own closes the channel: the plugin has to register again.
    """

    def __init__(self, resource: str, socket_path: Path, receiver: ListAndWatchReceiver) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self.stub: Any = pb_grpc.DevicePluginStub(self._channel)
        self._receiver = receiver
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
                self._receiver.list_and_watch_received(self, response, time.monotonic())
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
        with self._lock:
            by_kubelet, self._closed = self._closed, True
        if not by_kubelet:
            self._channel.close()
        end = StreamEnd(time.monotonic(), self.socket_path.name, code, details, by_kubelet)
        self._receiver.plugin_disconnected(self, end)

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
