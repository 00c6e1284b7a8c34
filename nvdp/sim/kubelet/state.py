"""The stand-in's device state: which plugin serves each resource, its device lists, what was seen.

It is the `PluginHandler` the Registration server and the plugin endpoints report to (the kubelet's
PluginConnected / PluginDisconnected / ListAndWatch receiver), and it keeps the observations tests,
`nvdp simulate` and the benchmarks wait on: registrations, refusals, device lists with receive times,
stream ends. No gRPC here beyond the messages it is handed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from nvdp.api import HEALTHY, pb
from nvdp.sim.kubelet.endpoint import PluginEndpoint, StreamEnd
from nvdp.sim.kubelet.registration import Registration, Rejection, SocketState

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeviceState(NamedTuple):
    health: str
    numa_nodes: tuple[int, ...]


class Update(NamedTuple):
    """One ListAndWatch response as received."""

    time: float  # time.monotonic() on receipt
    devices: Mapping[str, DeviceState]


class DeviceManagerState:
    """Thread-safe. Observations accumulate across kubelet restarts; device lists are what the running
    kubelet knows (`forget_devices` empties them), connected plugins what it talks to."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._socket_state: SocketState = "stopped"
        self.serving_since: float | None = None  # time.monotonic() when kubelet.sock last began accepting
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._devices: dict[str, dict[str, DeviceState]] = {}
        self._updates: dict[str, list[Update]] = {}
        self._stream_ends: dict[str, list[StreamEnd]] = {}
        self._registrations: list[Registration] = []
        self._rejections: list[Rejection] = []

    # -- what the Registration server and the endpoints report (PluginHandler) ---------------------

    def socket_state_changed(self, state: SocketState) -> None:
        with self._cond:
            self._socket_state = state
            if state == "serving":
                self.serving_since = time.monotonic()
            self._cond.notify_all()

    def plugin_connected(self, plugin: PluginEndpoint, registration: Registration) -> PluginEndpoint | None:
        with self._cond:
            old = self._endpoints.get(plugin.resource)
            self._endpoints[plugin.resource] = plugin
            self._registrations.append(registration)
            plugin.watch()
            self._cond.notify_all()
        return old

    def registration_refused(self, rejection: Rejection) -> None:
        with self._cond:
            self._rejections.append(rejection)
            self._cond.notify_all()

    def list_and_watch_received(
        self, plugin: PluginEndpoint, response: pb.ListAndWatchResponse, received: float
    ) -> None:
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

    def plugin_disconnected(self, plugin: PluginEndpoint, end: StreamEnd) -> None:
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

    # -- what a kubelet restart does --------------------------------------------------------------

    def disconnect_all(self) -> list[PluginEndpoint]:
        """Forget every connected plugin and return them (the caller closes them)."""
        with self._cond:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
            self._cond.notify_all()
        return endpoints

    def forget_devices(self) -> None:
        with self._cond:
            self._devices.clear()
            self._cond.notify_all()

    # -- observations -----------------------------------------------------------------------------

    @property
    def socket_state(self) -> SocketState:
        with self._cond:
            return self._socket_state

    def endpoint(self, resource: str) -> PluginEndpoint | None:
        with self._cond:
            return self._endpoints.get(resource)

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

    def node_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """What the kubelet writes to its Node's status for the device plugins' resources: capacity
        (every device listed) and allocatable (the healthy ones; none of a disconnected plugin's,
        which the kubelet marks unhealthy)."""
        with self._cond:
            capacity = {name: len(devices) for name, devices in self._devices.items()}
            allocatable = {
                name: sum(d.health == HEALTHY for d in devices.values()) if name in self._endpoints else 0
                for name, devices in self._devices.items()
            }
        return capacity, allocatable

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
        """Wait until the device list of `resource` satisfies `predicate` (default: not empty); a
        predicate that looks up a device not listed yet (KeyError) is not satisfied yet."""

        def check() -> tuple[dict[str, DeviceState]] | None:
            devices = self.devices(resource)
            try:
                return (devices,) if predicate(devices) else None
            except KeyError:
                return None

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
