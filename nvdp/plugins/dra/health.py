"""Device health for the DRA driver: the plugin's health monitor and router (`nvdp.node.health`, the same
XID policy and recovery) drive it through `DraHealthTarget`; what they say goes to the slices (taints
or withdrawal, `nvdp.plugins.dra.publisher`), to new claims (an Unhealthy device is refused,
`nvdp.plugins.dra.prepare`) and to the kubelet's DRA resource-health stream (`HealthStreams`), which puts it
in the status of the pods using the device.

The router calls `set_health` holding its lock: the target only records and calls `changed()` (which
must not block); the driver then reads the reasons from the router outside it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from nvdp.api.dra import Wire
from nvdp.base.logs import log_event
from nvdp.node.gpus.devices import DeviceSet
from nvdp.plugins.dra.names import DRIVER_NAME

log = logging.getLogger(__name__)

# Streams open at once, one place of them kept for the kubelet: the first stream after the kubelet's
# plugin watcher asked GetInfo (a registration), or after the kubelet's own stream ended (it dials
# again), is the kubelet's and is always admitted; other clients (a debugging grpcurl, a monitor)
# share the rest and are refused with RESOURCE_EXHAUSTED beyond it. No open stream is ended for a new one.
MAX_STREAMS = 4
HEALTH_MESSAGE_LIMIT = 1024


class DraHealthTarget:
    """The router's target: the driver's devices by GPU / MIG uuid (`nvdp.node.health.types.HealthTarget`)."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._devices = DeviceSet(())
        self._unhealthy: set[str] = set()
        self._changed = changed

    @property
    def resource_name(self) -> str:
        return DRIVER_NAME

    @property
    def devices(self) -> DeviceSet:
        with self._lock:
            return self._devices

    def set_devices(self, devices: DeviceSet) -> None:
        with self._lock:
            self._devices = devices
            self._unhealthy &= set(devices)

    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        with self._lock:
            ids = set(device_ids) & set(self._devices)
            if healthy:
                self._unhealthy -= ids
            else:
                self._unhealthy |= ids
        self._changed()

    def unhealthy(self) -> set[str]:
        """The uuids of the driver's devices that are Unhealthy."""
        with self._lock:
            return set(self._unhealthy)


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as the kubelet's stream says it."""

    device: str
    healthy: bool
    since: float  # unix time of the last change
    message: str = ""


class HealthStreams:
    """NodeWatchResources: every stream gets the whole list at once and again on every change."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._cond = threading.Condition()
        self._devices: tuple[DeviceHealth, ...] = ()
        self._version = 0
        self._others = 0  # streams open that are not the kubelet's
        self._kubelets = 0  # streams open that are the kubelet's (two across a kubelet restart)
        self._kubelet_awaited = False  # the next stream is the kubelet's
        self._told: set[str] = set()  # services a kubelet watched through (said once each)
        self._stopping = False

    def update(self, devices: Sequence[DeviceHealth]) -> None:
        with self._cond:
            if tuple(devices) != self._devices:
                self._devices = tuple(devices)
                self._version += 1
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def expect_kubelet(self) -> None:
        """The kubelet is registering the plugin: its health stream comes next."""
        with self._cond:
            self._kubelet_awaited = True

    def stream(self, wire: Wire, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._cond:
            kubelet = self._kubelet_awaited
            if kubelet:
                self._kubelet_awaited = False
                self._kubelets += 1
            elif self._others >= MAX_STREAMS - 1:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {MAX_STREAMS} health streams (one kept for the kubelet); close another first",
                )
            else:
                self._others += 1
            if wire.service not in self._told:
                self._told.add(wire.service)
                log_event(log, logging.INFO, "kubelet watches device health", service=wire.service)
        context.add_callback(self._wake)
        sent = -1
        try:
            while True:
                with self._cond:
                    while self._version == sent and not self._stopping and context.is_active():
                        self._cond.wait()
                    if self._stopping or not context.is_active():
                        return
                    sent, devices = self._version, self._devices
                yield self._response(wire, devices)
        finally:
            with self._cond:
                if not kubelet:
                    self._others -= 1
                else:
                    self._kubelets -= 1
                    if not self._kubelets and not self._stopping:
                        self._kubelet_awaited = True  # the kubelet dials again

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _response(self, wire: Wire, devices: Sequence[DeviceHealth]) -> Any:
        pb = wire.pb
        entries = []
        for d in devices:
            entry = pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self.pool, device_name=d.device),
                health=pb.HEALTHY if d.healthy else pb.UNHEALTHY,
                last_updated_time=int(d.since),
            )
            if "message" in pb.DeviceHealth.DESCRIPTOR.fields_by_name and d.message:
                text = d.message
                entry.message = text if len(text) <= HEALTH_MESSAGE_LIMIT else text[:1021] + "..."
            entries.append(entry)
        return pb.NodeWatchResourcesResponse(devices=entries)
