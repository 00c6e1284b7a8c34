"""One kubelet DevicePlugin gRPC server for one resource, on its own unix socket.

- Unary RPCs run on the shared worker pool handed in; ListAndWatch streams on a pool of the
  server's own, so open streams never hold a worker Allocate needs.
- Every open stream gets every device-list change; no stream is ended by another client's arrival.
- At most MAX_LIST_AND_WATCH_STREAMS at once, one kept for the kubelet: the first stream after each
  registration (`expect_kubelet_stream`) is the kubelet's (peers all read "unix:"); others beyond
  the bound get RESOURCE_EXHAUSTED.
- When the kubelet's stream ends while serving, the kubelet dropped the resource; the registration's
  callback is told so it registers again (`nvdp.plugins.deviceplugin.kubelet_link`).
- Every RPC goes through `nvdp.plugins.deviceplugin.status.rpc`, the one mapping of nvdp errors to gRPC codes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from nvdp.api import HEALTHY, UNHEALTHY, pb, pb_grpc
from nvdp.base.errors import NvdpError, RequestError
from nvdp.base.logs import log_event
from nvdp.config.model import MPS
from nvdp.node.gpus.devices import Device, DeviceSet, format_ids
from nvdp.node.gpus.resources import Resource
from nvdp.plugins.deviceplugin.responses import ResponseOptions, container_response
from nvdp.plugins.deviceplugin.status import RpcObserver, rpc
from nvdp.plugins.kubeletplugin.socket_server import UnixSocketServer

log = logging.getLogger(__name__)

T = TypeVar("T")
# Per server, the kubelet's stream included: the kubelet and a few debuggers or monitors. An idle stream
# costs a parked thread (docs/hardening.md has the measured memory).
MAX_LIST_AND_WATCH_STREAMS = 16
REFUSAL_LOG_INTERVAL_S = 60.0  # a client retrying a refused stream logs one line a minute, with the count


class PreferredAllocator(Protocol):
    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]: ...


@dataclass(eq=False)
class _Stream:
    """One open ListAndWatch stream; `kubelet_lost` is set on the kubelet's (called when it ends)."""

    context: grpc.ServicerContext
    kubelet_lost: Callable[[], None] | None = None


class _OnPool:
    """A method handler that grpc runs on `experimental_thread_pool` instead of the server's pool."""

    def __init__(self, behavior: Callable[..., Any], pool: ThreadPoolExecutor) -> None:
        self._behavior = behavior
        self.experimental_thread_pool = pool

    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._behavior(request, context)


class _Handlers:
    """The servicer as grpc sees it: unary RPCs on the server's pool, ListAndWatch on its own."""

    def __init__(self, server: DevicePluginServer, stream_pool: ThreadPoolExecutor) -> None:
        self.GetDevicePluginOptions = server.GetDevicePluginOptions
        self.GetPreferredAllocation = server.GetPreferredAllocation
        self.Allocate = server.Allocate
        self.PreStartContainer = server.PreStartContainer
        self.ListAndWatch = _OnPool(server.ListAndWatch, stream_pool)


class DevicePluginServer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Serves one resource. Thread-safe; `set_health` may be called from any thread."""

    def __init__(
        self,
        resource: Resource,
        socket_path: Path,
        options: ResponseOptions,
        executor: ThreadPoolExecutor,
        allocator: PreferredAllocator | None = None,
        observer: RpcObserver | None = None,
    ) -> None:
        self.resource = resource
        self.observer = observer
        self.socket_path = socket_path
        self.options = options
        self._allocator = allocator
        self._cond = threading.Condition()
        self._health: dict[str, bool] = dict.fromkeys(resource.devices, True)
        self._version = 0
        self._list_response = self._build_list()
        self._stopping = False
        self._streams: list[_Stream] = []
        self._kubelet_stream: _Stream | None = None  # the stream opened first after the registration
        self._awaited_kubelet: Callable[[], None] | None = None  # registered, its stream not opened yet
        self._refused = 0  # streams refused since the last refusal line
        self._refusal_logged: float | None = None  # time.monotonic() of the last refusal line
        self._stream_pool: ThreadPoolExecutor | None = None
        self._socket = UnixSocketServer(socket_path, self._add_services, executor)
        self._needs_request_id = "cdi-annotations" in options.device_list_strategy

    # ---- identity, used by the supervisor and the health router -------------------------------
    @property
    def resource_name(self) -> str:
        return self.resource.name

    @property
    def devices(self) -> DeviceSet:
        return self.resource.devices

    @property
    def allocator(self) -> PreferredAllocator | None:
        return self._allocator

    @property
    def open_streams(self) -> int:
        with self._cond:
            return len(self._streams)

    def health(self) -> dict[str, bool]:
        with self._cond:
            return dict(self._health)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on the socket (`nvdp.plugins.kubeletplugin.socket_server`: a stale one replaced, 0600 from
        bind) and serve. Raises NvdpError (one line, with the OS error) when the socket cannot be
        made; nothing is left running then, and start() may be called again."""
        if self._socket.serving:
            return
        # Room over the bound for earlier kubelet streams the kubelet has not closed yet and for
        # refusing excess streams; a thread starts only when a stream needs it.
        pool = ThreadPoolExecutor(
            max_workers=2 * MAX_LIST_AND_WATCH_STREAMS, thread_name_prefix="grpc-stream"
        )
        self._stream_pool = pool
        with self._cond:
            self._stopping = False
        try:
            self._socket.start()
        except NvdpError:
            self._stream_pool = None
            pool.shutdown(wait=False)
            raise

    def _add_services(self, server: grpc.Server) -> None:
        assert self._stream_pool is not None
        pb_grpc.add_DevicePluginServicer_to_server(_Handlers(self, self._stream_pool), server)

    def socket_is_ours(self) -> bool:
        """False when our socket file was deleted or replaced (a kubelet restart wipes it)."""
        return self._socket.socket_is_ours()

    def abandon(self) -> None:
        """A stop that did not finish: remove our socket file now, without stopping."""
        self._socket.abandon()

    def stop(self, grace: float = 0.5) -> None:
        """End ListAndWatch streams cleanly, stop the server, remove our socket. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._socket.stop(grace)
        pool, self._stream_pool = self._stream_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- health -------------------------------------------------------------------------------
    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        """Mark devices; one ListAndWatch update is sent when anything changed."""
        with self._cond:
            changed = False
            for device_id in device_ids:
                if device_id in self._health and self._health[device_id] != healthy:
                    self._health[device_id] = healthy
                    changed = True
            if changed:
                self._version += 1
                self._list_response = self._build_list()
                self._cond.notify_all()

    def _build_list(self) -> pb.ListAndWatchResponse:
        response = pb.ListAndWatchResponse()
        for device in self.resource.devices.values():
            item = response.devices.add(
                ID=device.id, health=HEALTHY if self._health[device.id] else UNHEALTHY
            )
            if device.numa_node is not None:
                item.topology.nodes.add(ID=device.numa_node)
        return response

    # ---- DevicePlugin service -----------------------------------------------------------------
    @rpc
    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self._allocator is not None
        )

    def expect_kubelet_stream(self, lost: Callable[[], None]) -> None:
        """A registration is being sent: the next stream to open is the kubelet's. It is admitted
        whatever other clients hold, and `lost` is called (on the stream's thread) when it ends while
        this server serves. The kubelet's stream of an earlier registration is then an ordinary one."""
        with self._cond:
            self._awaited_kubelet = lost
            self._kubelet_stream = None

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Any:
        stream = self._admit(context)

        def wake() -> None:
            with self._cond:
                self._cond.notify_all()

        context.add_callback(wake)
        is_kubelet = stream.kubelet_lost is not None
        log_event(
            log,
            logging.INFO,
            "ListAndWatch started",
            resource=self.resource_name,
            devices=len(self.resource.devices),
            client="kubelet" if is_kubelet else "other",
        )
        try:
            sent = -1
            while True:
                with self._cond:
                    while sent == self._version and not self._stopping and context.is_active():
                        self._cond.wait(timeout=30.0)
                    if self._stopping or not context.is_active():
                        return
                    sent = self._version
                    response = self._list_response
                yield response
        finally:
            self._stream_ended(stream, is_kubelet)

    def _stream_ended(self, stream: _Stream, was_kubelet: bool) -> None:
        with self._cond:
            self._streams.remove(stream)
            lost = stream.kubelet_lost if stream is self._kubelet_stream and not self._stopping else None
            if stream is self._kubelet_stream:
                self._kubelet_stream = None
        client = "kubelet" if was_kubelet else "other"
        log_event(log, logging.INFO, "ListAndWatch ended", resource=self.resource_name, client=client)
        if lost is not None:
            lost()

    def _admit(self, context: grpc.ServicerContext) -> _Stream:
        """Count a new stream in: the awaited kubelet's always, another client's while under the bound
        (else refused with RESOURCE_EXHAUSTED). No open stream is ever ended for a new one."""
        started = time.perf_counter()
        with self._cond:
            stream = _Stream(context, self._awaited_kubelet)
            others = sum(s is not self._kubelet_stream for s in self._streams)
            admitted = stream.kubelet_lost is not None or others < MAX_LIST_AND_WATCH_STREAMS - 1
            if admitted:
                self._streams.append(stream)
                if stream.kubelet_lost is not None:
                    self._kubelet_stream, self._awaited_kubelet = stream, None
                return stream
            self._refused += 1
            now = time.monotonic()
            last = self._refusal_logged
            refused, log_now = self._refused, last is None or now - last >= REFUSAL_LOG_INTERVAL_S
            if log_now:
                self._refused, self._refusal_logged = 0, now
        message = (
            f"{self.resource_name}: at most {MAX_LIST_AND_WATCH_STREAMS} ListAndWatch streams "
            "(one kept for the kubelet); close another stream first"
        )
        if log_now:
            log_event(
                log,
                logging.WARNING,
                "ListAndWatch refused: too many streams",
                resource=self.resource_name,
                limit=MAX_LIST_AND_WATCH_STREAMS,
                refused=refused,
            )
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        if self.observer is not None:
            self.observer.rpc_done(self.resource_name, "ListAndWatch", code, time.perf_counter() - started)
        context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    @rpc
    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        if self._allocator is None:
            raise RequestError(f"{self.resource_name}: GetPreferredAllocation is not available")
        response = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            ids = self._allocator.preferred(
                req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size
            )
            response.container_responses.add(deviceIDs=ids)
        return response

    @rpc
    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        devices = self.resource.devices
        if not request.container_requests:
            raise RequestError(f"{self.resource_name}: Allocate request has no container requests")
        response = pb.AllocateResponse()
        for n, req in enumerate(request.container_requests):
            ids = list(dict.fromkeys(req.devices_ids))
            if not ids:
                raise RequestError(f"{self.resource_name}: container request {n} has no device IDs")
            unknown = devices.unknown(ids)
            if unknown:
                raise RequestError(f"{self.resource_name}: unknown device IDs: {format_ids(unknown)}")
            chosen: list[Device] = [devices[i] for i in ids]
            if (
                self.resource.fail_requests_greater_than_one
                and len(chosen) > 1
                and any(d.replica is not None for d in chosen)
            ):
                raise RequestError(
                    f"request for '{self.resource_name}: {len(ids)}' too large: "
                    "maximum request size for shared resources is 1"
                )
            request_id = os.urandom(16).hex() if self._needs_request_id else ""
            response.container_responses.append(container_response(chosen, self.options, request_id))
            if self.resource.sharing == MPS:  # nvdp.node.mps is loaded by an MPS resource's first Allocate
                from nvdp.node.mps.allocate import add_mps

                add_mps(response.container_responses[-1], self.resource, chosen, self.options.mps_root)
        return response

    @rpc
    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # ---- live device changes (reloads and rescans) --------------------------------------------
    def update_resource(self, resource: Resource, allocator: PreferredAllocator | None) -> None:
        """Serve `resource` (same name, changed devices) without a restart: open ListAndWatch
        streams get the new list, the registration stays. Devices that remain keep their health."""
        if resource.name != self.resource.name or (allocator is None) != (self._allocator is None):
            raise ValueError(f"{self.resource.name}: an update cannot change the name or the options")
        with self._cond:
            self._health = {i: self._health.get(i, True) for i in resource.devices}
            self.resource = resource
            self._allocator = allocator
            self._version += 1
            self._list_response = self._build_list()
            self._cond.notify_all()
