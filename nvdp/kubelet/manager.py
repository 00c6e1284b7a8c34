"""The kubelet stand-in: the kubelet's side of the device-plugin protocol, in process.

It behaves like the kubelet's device manager: a Registration server on `kubelet.sock` that checks the
version and resource name, dials the plugin (blocking, before Register answers), asks for its options,
replaces an earlier plugin of the same resource, and keeps ListAndWatch open on a thread. It calls
GetPreferredAllocation, Allocate and PreStartContainer for tests, `nvdp simulate` and benchmarks, and it
records what it saw (registrations, device lists with receive times, stream ends) for them to wait on.

A restart is what a real kubelet restart looks like to a plugin: every connection drops, every socket in
the plugin directory but the checkpoint goes, and `kubelet.sock` comes back (optionally refusing
connections for a while first).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, NoReturn, TypeVar

import grpc

from nvdp.api import HEALTHY, pb, pb_grpc
from nvdp.errors import NvdpError
from nvdp.kubelet.endpoint import PluginEndpoint, StreamEnd
from nvdp.kubelet.validation import endpoint_problem, registration_problem

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
MAX_SOCKET_PATH = 107  # bytes, sun_path less its terminating NUL

State = Literal["stopped", "refusing", "serving"]
T = TypeVar("T")


class KubeletError(NvdpError):
    """The stand-in cannot do what was asked (bad socket path, no plugin for a resource...)."""


class PluginNotConnected(KubeletError):
    """No plugin is connected for the resource (never registered, stream ended, kubelet restarted)."""


class Registration(NamedTuple):
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    time: float  # time.monotonic() when the Register call arrived


class Rejection(NamedTuple):
    resource: str
    endpoint: str
    version: str
    message: str
    time: float


class DeviceState(NamedTuple):
    health: str
    numa_nodes: tuple[int, ...]


class Update(NamedTuple):
    """One ListAndWatch response as received."""

    time: float  # time.monotonic() on receipt
    devices: Mapping[str, DeviceState]


def cleanup_plugin_dir(plugin_dir: Path) -> list[str]:
    """Remove every socket in `plugin_dir` except the checkpoint, as the kubelet does at start."""
    removed = []
    for entry in os.scandir(plugin_dir):
        if entry.name == CHECKPOINT_FILE:
            continue
        try:
            if stat.S_ISSOCK(os.stat(entry.path).st_mode):
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:
            continue
    return removed


class _RegistrationService:
    """The Registration servicer; bound to one server generation so stale calls can be refused."""

    def __init__(self, handler: Callable[[pb.RegisterRequest, Any], pb.Empty]) -> None:
        self._handler = handler

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        return self._handler(request, context)


class Kubelet:
    """`with Kubelet(dir) as kubelet:` serves `dir/kubelet.sock` until the block ends.

    Lifecycle calls (start, restart, stop) are serialized; everything else is thread-safe. Observations
    (registrations, updates, stream ends) accumulate across restarts; device lists are what the running
    kubelet knows, so a restart empties them until plugins register again.
    """

    def __init__(
        self,
        plugin_dir: Path | str,
        *,
        dial_timeout: float = 10.0,
        rpc_timeout: float = 10.0,
        workers: int = 4,
    ) -> None:
        self.plugin_dir = Path(plugin_dir).absolute()
        self.socket_path = self.plugin_dir / KUBELET_SOCKET
        self.dial_timeout = dial_timeout
        self.rpc_timeout = rpc_timeout
        self._workers = workers
        self._lifecycle = threading.Lock()
        self._cond = threading.Condition(threading.RLock())
        self._state: State = "stopped"
        self._generation = 0
        self._server: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._dialing: set[PluginEndpoint] = set()
        self._devices: dict[str, dict[str, DeviceState]] = {}
        self._updates: dict[str, list[Update]] = {}
        self._stream_ends: dict[str, list[StreamEnd]] = {}
        self._registrations: list[Registration] = []
        self._rejections: list[Rejection] = []
        self.serving_since: float | None = None  # time.monotonic() when kubelet.sock last began accepting

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Clean the plugin directory and serve the Registration service on kubelet.sock."""
        with self._lifecycle:
            if self._state != "stopped":
                raise KubeletError(f"kubelet stand-in already running on {self.socket_path}")
            self._serve(0.0)

    def restart(self, accept_delay: float = 0.0) -> None:
        """Restart like a real kubelet: drop every plugin, remove the sockets, re-create kubelet.sock.

        With `accept_delay`, kubelet.sock exists but refuses connections (ECONNREFUSED) for that many
        seconds before it serves; the call returns once it serves.
        """
        with self._lifecycle:
            log.info("kubelet restarting dir=%s accept_delay=%s", self.plugin_dir, accept_delay)
            self._shutdown()
            self._serve(accept_delay)

    def stop(self) -> None:
        """Stop serving and close every plugin connection; idempotent."""
        with self._lifecycle:
            self._shutdown()

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def state(self) -> State:
        with self._cond:
            return self._state

    def _set_state(self, state: State) -> None:
        with self._cond:
            self._state = state
            if state == "serving":
                self.serving_since = time.monotonic()
            self._cond.notify_all()

    def _serve(self, accept_delay: float) -> None:
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise KubeletError(f"socket path {self.socket_path} is longer than {MAX_SOCKET_PATH} bytes")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        removed = cleanup_plugin_dir(self.plugin_dir)
        if removed:
            log.info("removed plugin sockets dir=%s sockets=%s", self.plugin_dir, ",".join(sorted(removed)))
        with self._cond:
            self._devices.clear()
            generation = self._generation
        placeholder = None
        try:
            if accept_delay > 0:
                # Bound but not listening: the file is there and connects fail with ECONNREFUSED.
                placeholder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                placeholder.bind(os.fsencode(self.socket_path))
                self._set_state("refusing")
                time.sleep(accept_delay)
            executor = ThreadPoolExecutor(self._workers, thread_name_prefix="kubelet-registration")
            server = grpc.server(executor)
            service = _RegistrationService(functools.partial(self._register, generation))
            pb_grpc.add_RegistrationServicer_to_server(service, server)
            try:
                server.add_insecure_port(f"unix:{self.socket_path}")  # replaces the placeholder's file
                server.start()
            except Exception as e:
                executor.shutdown(wait=True)
                raise KubeletError(f"cannot serve {self.socket_path}: {e}") from e
        except BaseException:
            self._set_state("stopped")
            raise
        finally:
            if placeholder is not None:
                placeholder.close()
        with self._cond:
            self._server, self._executor = server, executor
        self._set_state("serving")
        log.info("kubelet serving socket=%s", self.socket_path)

    def _shutdown(self) -> None:
        with self._cond:
            if self._state == "stopped":
                return
            self._generation += 1
            server, executor = self._server, self._executor
            self._server, self._executor = None, None
            endpoints = [*self._endpoints.values(), *self._dialing]
            self._endpoints.clear()
        if server is not None:
            server.stop(None).wait()
        for endpoint in endpoints:
            endpoint.close()
        if executor is not None:
            executor.shutdown(wait=True)
        for endpoint in endpoints:
            endpoint.join()
        self._set_state("stopped")
        log.info("kubelet stopped socket=%s", self.socket_path)

    # -- Registration service --------------------------------------------------------------------

    def _register(self, generation: int, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        arrived = time.monotonic()
        resource, endpoint = request.resource_name, request.endpoint
        log.info(
            "registration request resource=%s endpoint=%s version=%s", resource, endpoint, request.version
        )
        problem = registration_problem(request.version, resource) or endpoint_problem(
            self.plugin_dir, endpoint
        )
        if problem:
            self._reject(context, request, arrived, problem)

        plugin = PluginEndpoint(resource, self.plugin_dir / endpoint, self._on_update, self._on_end)
        with self._cond:
            if generation != self._generation:
                plugin.close()
                self._reject(context, request, arrived, "kubelet is restarting", grpc.StatusCode.UNAVAILABLE)
            self._dialing.add(plugin)
        try:
            options = plugin.connect(self.dial_timeout)
        except grpc.RpcError as e:
            plugin.close()
            self._reject(
                context, request, arrived, f"failed to dial device plugin: {e.code().name}: {e.details()}"
            )
        finally:
            with self._cond:
                self._dialing.discard(plugin)

        with self._cond:
            if generation != self._generation:
                plugin.close()
                self._reject(context, request, arrived, "kubelet is restarting", grpc.StatusCode.UNAVAILABLE)
            old = self._endpoints.get(resource)
            self._endpoints[resource] = plugin
            self._registrations.append(Registration(resource, endpoint, options, arrived))
            plugin.watch()
            self._cond.notify_all()
        if old is not None:
            log.info("replacing plugin resource=%s old=%s new=%s", resource, old.socket_path.name, endpoint)
            old.close()
            old.join()
        log.info(
            "plugin registered resource=%s endpoint=%s pre_start_required=%s "
            "get_preferred_allocation_available=%s",
            resource,
            endpoint,
            options.pre_start_required,
            options.get_preferred_allocation_available,
        )
        return pb.Empty()

    def _reject(
        self,
        context: Any,
        request: pb.RegisterRequest,
        arrived: float,
        message: str,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,  # what a plain Go error becomes on the wire
    ) -> NoReturn:
        log.info("registration refused resource=%s reason=%r", request.resource_name, message)
        with self._cond:
            self._rejections.append(
                Rejection(request.resource_name, request.endpoint, request.version, message, arrived)
            )
            self._cond.notify_all()
        context.abort(code, message)
        raise AssertionError("context.abort returned")

    def _on_update(self, plugin: PluginEndpoint, response: pb.ListAndWatchResponse, received: float) -> None:
        devices = {
            d.ID: DeviceState(d.health, tuple(n.ID for n in d.topology.nodes)) for d in response.devices
        }
        with self._cond:
            if self._endpoints.get(plugin.resource) is not plugin:
                return
            self._devices[plugin.resource] = devices
            self._updates.setdefault(plugin.resource, []).append(Update(received, devices))
            self._cond.notify_all()
        healthy = sum(d.health == HEALTHY for d in devices.values())
        log.debug(
            "ListAndWatch update resource=%s devices=%d healthy=%d", plugin.resource, len(devices), healthy
        )

    def _on_end(self, plugin: PluginEndpoint, end: StreamEnd) -> None:
        with self._cond:
            self._stream_ends.setdefault(plugin.resource, []).append(end)
            if self._endpoints.get(plugin.resource) is plugin:
                del self._endpoints[plugin.resource]
            self._cond.notify_all()
        log.info(
            "ListAndWatch ended resource=%s endpoint=%s code=%s by_kubelet=%s details=%r",
            plugin.resource,
            end.endpoint,
            end.code.name,
            end.by_kubelet,
            end.details,
        )

    # -- observations ----------------------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        with self._cond:
            return list(self._registrations)

    @property
    def rejections(self) -> list[Rejection]:
        with self._cond:
            return list(self._rejections)

    def resources(self) -> list[str]:
        """Resources with a connected plugin."""
        with self._cond:
            return sorted(self._endpoints)

    def devices(self, resource: str) -> dict[str, DeviceState]:
        """The latest device list of `resource` ({} before the first update or after a restart)."""
        with self._cond:
            return dict(self._devices.get(resource, {}))

    def updates(self, resource: str) -> list[Update]:
        with self._cond:
            return list(self._updates.get(resource, []))

    def stream_ends(self, resource: str) -> list[StreamEnd]:
        with self._cond:
            return list(self._stream_ends.get(resource, []))

    def stream_closed(self, resource: str) -> bool:
        """True when no ListAndWatch stream of `resource` is open."""
        with self._cond:
            return resource not in self._endpoints

    def wait_for(
        self, predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "condition"
    ) -> T:
        """Wait until `predicate()` is truthy (it runs with the state locked); return its value."""
        with self._cond:
            value = self._cond.wait_for(predicate, timeout)
        if not value:
            raise TimeoutError(f"kubelet stand-in: no {what} within {timeout}s")
        return value

    def wait_for_registration(self, resource: str, count: int = 1, timeout: float = 10.0) -> Registration:
        """Wait for the `count`-th registration of `resource` (counting across restarts); return it."""

        def nth() -> Registration | None:
            matching = [r for r in self._registrations if r.resource == resource]
            return matching[count - 1] if len(matching) >= count else None

        try:
            return self.wait_for(nth, timeout, f"registration #{count} of {resource}")
        except TimeoutError as e:
            refused = [r.message for r in self.rejections if r.resource == resource]
            raise TimeoutError(f"{e}; refused: {refused}" if refused else str(e)) from None

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, DeviceState]], bool] = bool,
        timeout: float = 10.0,
    ) -> dict[str, DeviceState]:
        """Wait until the device list of `resource` satisfies `predicate` (default: not empty)."""

        def check() -> tuple[dict[str, DeviceState]] | None:
            devices = self.devices(resource)
            return (devices,) if predicate(devices) else None

        try:
            return self.wait_for(check, timeout, f"matching device list for {resource}")[0]
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last list: {self.devices(resource)}") from None

    def wait_for_updates(self, resource: str, count: int, timeout: float = 10.0) -> list[Update]:
        """Wait until `resource` has received at least `count` ListAndWatch responses in all."""

        def enough() -> tuple[list[Update]] | None:
            updates = self.updates(resource)
            return (updates,) if len(updates) >= count else None

        return self.wait_for(enough, timeout, f"{count} ListAndWatch updates for {resource}")[0]

    def wait_for_stream_closed(self, resource: str, timeout: float = 10.0) -> None:
        self.wait_for(lambda: self.stream_closed(resource), timeout, f"end of the {resource} stream")

    # -- calls into plugins (gRPC errors propagate as grpc.RpcError) ------------------------------

    def stub(self, resource: str) -> Any:
        """The DevicePlugin stub of the plugin connected for `resource` (its one channel)."""
        with self._cond:
            plugin = self._endpoints.get(resource)
        if plugin is None:
            raise PluginNotConnected(f"no device plugin connected for resource {resource}")
        return plugin.stub

    def _call(self, resource: str, invoke: Callable[[Any], T]) -> T:
        stub = self.stub(resource)
        try:
            return invoke(stub)
        except ValueError as e:  # grpc: "Cannot invoke RPC on closed channel!"
            raise PluginNotConnected(f"device plugin for resource {resource} disconnected: {e}") from e

    def options(self, resource: str) -> pb.DevicePluginOptions:
        options: pb.DevicePluginOptions = self._call(
            resource, lambda s: s.GetDevicePluginOptions(pb.Empty(), timeout=self.rpc_timeout)
        )
        return options

    def allocate(self, resource: str, containers: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        """Allocate, one container request per entry of `containers`."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers]
        )
        response: pb.AllocateResponse = self._call(
            resource, lambda s: s.Allocate(request, timeout=self.rpc_timeout)
        )
        return response

    def get_preferred_allocation(
        self, resource: str, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        response: pb.PreferredAllocationResponse = self._call(
            resource, lambda s: s.GetPreferredAllocation(request, timeout=self.rpc_timeout)
        )
        return response

    def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The plugin's preferred `size` devices for one container."""
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = self.get_preferred_allocation(resource, request)
        if len(response.container_responses) != 1:
            raise KubeletError(
                f"GetPreferredAllocation for {resource} answered {len(response.container_responses)} "
                "containers for 1 request"
            )
        return list(response.container_responses[0].deviceIDs)

    def pre_start_container(self, resource: str, ids: Sequence[str]) -> pb.PreStartContainerResponse:
        request = pb.PreStartContainerRequest(devices_ids=list(ids))
        response: pb.PreStartContainerResponse = self._call(
            resource, lambda s: s.PreStartContainer(request, timeout=self.rpc_timeout)
        )
        return response
