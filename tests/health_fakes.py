"""A recording HealthTarget (what a plugin server is to the health router)."""

from __future__ import annotations

from collections.abc import Collection

from nvdp.devices import Device, DeviceSet


class FakeTarget:
    def __init__(self, resource: str, devices: list[Device]) -> None:
        self.resource_name = resource
        self.devices = DeviceSet(devices)
        self.calls: list[tuple[list[str], bool]] = []

    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        self.calls.append((sorted(device_ids), healthy))
