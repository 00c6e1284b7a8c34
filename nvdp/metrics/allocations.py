"""The allocation ledger on the metrics endpoint: the /allocations page (JSON) and the
`nvdp_device_allocated` family, both read at request time.

A request reads the kubelet's PodResources API when the ledger's last read is older than the page's
bound (ALLOCATIONS_MAX_AGE_S for /allocations, METRICS_MAX_AGE_S for a scrape), so a page is never
staler than that, and a node nobody asks costs no reads. The family has one sample per device held,
1 while held: its label set is bounded by the node's devices and the pods holding them, and a series
ends with its pod's hold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvdp.health.types import HealthChange
from nvdp.ledger.document import Served, allocations_document
from nvdp.metrics.sources import HealthView, LedgerView, RegistrationState
from nvdp.nvml.types import GpuInfo
from nvdp.promtext import MetricFamily

ALLOCATIONS_MAX_AGE_S = 1.0
METRICS_MAX_AGE_S = 5.0
JSON_CONTENT_TYPE = "application/json"


def unhealthy_reason(change: HealthChange) -> str:
    """Why a device is Unhealthy, in one line: `XID 79: GPU has fallen off the bus (fatal)`."""
    reason = f"XID {change.xid}: {change.reason}" if change.xid is not None else change.reason
    return f"{reason} (fatal)" if change.fatal else reason


class AllocationPages:
    """Builds /allocations and the allocated-device samples from the ledger, the supervisor's servers
    (`registrations`), the node's health and the GPUs served (`gpus`)."""

    def __init__(
        self,
        ledger: LedgerView,
        registrations: RegistrationState,
        health: HealthView | None,
        gpus: Callable[[], Sequence[GpuInfo] | None],
    ) -> None:
        self._ledger, self._registrations, self._health, self._gpus = ledger, registrations, health, gpus

    def document(self, max_age: float = ALLOCATIONS_MAX_AGE_S) -> dict[str, Any]:
        snapshot = self._ledger.recent(max_age)
        served = {
            name: Served(server.resource.devices, server.health())
            for name, server in dict(self._registrations.servers).items()
        }
        unhealthy: Mapping[str, HealthChange] = self._health.unhealthy() if self._health is not None else {}
        reasons = {uuid: unhealthy_reason(change) for uuid, change in unhealthy.items()}
        return allocations_document(snapshot, served, reasons, self._gpus() or [], time.time())

    def render(self) -> bytes:
        return json.dumps(self.document(), indent=1).encode() + b"\n"

    def collect(self) -> list[MetricFamily]:
        family = MetricFamily(
            "nvdp_device_allocated",
            "1 while a container holds the device (from the kubelet's PodResources API).",
            "gauge",
            ["resource", "device", "gpu_uuid", "namespace", "pod", "container"],
        )
        for resource, devices in self.document(METRICS_MAX_AGE_S)["resources"].items():
            for device in devices:
                for pod in device["pods"]:
                    labels = [resource, device["device"], device["gpu"] or "", pod["namespace"], pod["name"]]
                    family.add([*labels, pod["container"]], 1.0)
        return [family]
