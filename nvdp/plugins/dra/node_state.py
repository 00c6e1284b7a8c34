"""What the DRA driver knows of its node now: the published devices and which are Unhealthy, with the
taint and the kubelet health each gets (`nvdp.plugins.dra.prepare.Inventory` for the preparer).

`set_devices` takes an enumeration's devices (after a rescan), `set_health` the Unhealthy GPU / MIG
uuids and the router's reasons; both answer what changed for the publisher and the health streams.
A device keeps the taint (and time) it got when it turned Unhealthy until it recovers. A MIG device
is also found by its former name (`nvdp.plugins.dra.names.former_mig_device_name`): a claim allocated from the
slice of the nvdp before an upgrade names it so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from nvdp.node.health.types import HealthChange
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.health import DeviceHealth
from nvdp.plugins.dra.slices import Taint


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(int(unix), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeState:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._devices: dict[str, DraDevice] = {}
        self._former: dict[str, str] = {}  # a MIG device's former name -> its name
        self._taints: dict[str, Taint] = {}  # device name -> why it is Unhealthy
        self._reasons: dict[str, str] = {}  # device name -> why it is Unhealthy, in words
        self._since: dict[str, float] = {}  # device name -> unix time of its last health change

    def set_devices(self, devices: Sequence[DraDevice]) -> None:
        with self._lock:
            now = self._clock()
            self._devices = {d.name: d for d in devices}
            self._former = {d.former_name: d.name for d in devices if d.former_name}
            for name in set(self._taints) - set(self._devices):
                del self._taints[name]
            self._since = {n: self._since.get(n, now) for n in self._devices}

    def set_health(self, unhealthy: set[str], changes: Mapping[str, HealthChange]) -> None:
        """`unhealthy`: GPU / MIG uuids; `changes`: the router's change that made each so."""
        with self._lock:
            now = self._clock()
            for name, device in self._devices.items():
                change = changes.get(device.uuid)
                bad = device.uuid in unhealthy
                if bad and name not in self._taints:
                    reason = change.reason if change else "unhealthy"
                    xid = change.xid if change else None
                    self._taints[name] = Taint.of(reason, xid, rfc3339(now))
                    self._reasons[name] = f"XID {xid}: {reason}" if xid is not None else reason
                    self._since[name] = now
                elif not bad and name in self._taints:
                    del self._taints[name]
                    self._reasons.pop(name, None)
                    self._since[name] = now

    def devices(self) -> list[DraDevice]:
        with self._lock:
            return list(self._devices.values())

    def taints(self) -> dict[str, Taint]:
        with self._lock:
            return dict(self._taints)

    def health(self) -> list[DeviceHealth]:
        with self._lock:
            return [
                DeviceHealth(n, n not in self._taints, self._since[n], self._reasons.get(n, ""))
                for n in self._devices
            ]

    # ---- nvdp.plugins.dra.prepare.Inventory ----
    def device(self, name: str) -> DraDevice | None:
        with self._lock:
            return self._devices.get(self._current(name))

    def unhealthy(self, name: str) -> Taint | None:
        with self._lock:
            return self._taints.get(self._current(name))

    def _current(self, name: str) -> str:
        return name if name in self._devices else self._former.get(name, name)
