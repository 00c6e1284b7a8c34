"""The allocation ledger on the metrics endpoint: the /allocations page (JSON) and the
`nvdp_device_allocated` family, both read at request time.

- A request reads the PodResources API only when the ledger's last read is older than the page's
  bound (ALLOCATIONS_MAX_AGE_S; METRICS_MAX_AGE_S for a scrape); a node nobody asks costs no reads.
- The family has one sample per device held, 1 while held: bounded by the node's devices and the
  pods holding them; a series ends with its pod's hold.
- Which pod holds a device is told only to loopback clients (`nvdp status` in the plugin's
  container), unless `pod_detail` is "all" (--pod-detail).
- Other clients get the devices, their health and how many containers hold each, and the family
  without its namespace, pod and container labels.
- On a node split between the APIs, the DRA plugin's devices are listed too, under `gpu.nvidia.com`
  (its allocations file, `nvdp.plugins.ledger.dra_file`): the claims and pods holding each, its share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nvdp.base.http_endpoint import is_loopback
from nvdp.base.promtext import MetricFamily
from nvdp.node.health.types import HealthChange
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.ledger.document import Served, allocations_document
from nvdp.plugins.ledger.dra_file import dra_resource, read_dra_allocations
from nvdp.plugins.metrics.sources import HealthView, LedgerView, RegistrationState

ALLOCATIONS_MAX_AGE_S = 1.0
METRICS_MAX_AGE_S = 5.0
JSON_CONTENT_TYPE = "application/json"


def unhealthy_reason(change: HealthChange) -> str:
    """Why a device is Unhealthy, in one line: `XID 79: GPU has fallen off the bus (fatal)`."""
    reason = f"XID {change.xid}: {change.reason}" if change.xid is not None else change.reason
    return f"{reason} (fatal)" if change.fatal else reason


class AllocationPages:
    """Builds /allocations and the allocated-device samples from the ledger, the supervisor's servers
    (`registrations`), the node's health and the GPUs served (`gpus`); the pods holding devices are
    shown as `pod_detail` says (local: to loopback clients only; all)."""

    def __init__(
        self,
        ledger: LedgerView,
        registrations: RegistrationState,
        health: HealthView | None,
        gpus: Callable[[], Sequence[GpuInfo] | None],
        pod_detail: str = "local",
        dra_file: Path | None = None,
    ) -> None:
        self._ledger, self._registrations, self._health, self._gpus = ledger, registrations, health, gpus
        self.pod_detail = pod_detail
        self._dra_file = dra_file  # the DRA plugin's allocations on a node split between the APIs

    def shows_pods(self, peer: str) -> bool:
        """Whether the client at `peer` (its IP address) is told which pods hold the devices."""
        return self.pod_detail == "all" or is_loopback(peer)

    def document(self, max_age: float = ALLOCATIONS_MAX_AGE_S, *, pods: bool = True) -> dict[str, Any]:
        """The /allocations document; without `pods`, how many containers hold each device only."""
        snapshot = self._ledger.recent(max_age)
        served = {
            name: Served(server.resource.devices, server.health())
            for name, server in dict(self._registrations.servers).items()
        }
        unhealthy: Mapping[str, HealthChange] = self._health.unhealthy() if self._health is not None else {}
        reasons = {uuid: unhealthy_reason(change) for uuid, change in unhealthy.items()}
        gpus = self._gpus() or []
        document = allocations_document(snapshot, served, reasons, gpus, time.time(), pods=pods)
        dra = read_dra_allocations(self._dra_file) if self._dra_file is not None else None
        if dra is not None:  # the DRA driver's name as the resource's
            document["resources"][dra[0]] = dra_resource(dra[1], pods)
        return document

    def render(self, peer: str) -> bytes:
        """/allocations for the client at `peer`."""
        return json.dumps(self.document(pods=self.shows_pods(peer)), indent=1).encode() + b"\n"

    def collect(self, peer: str) -> list[MetricFamily]:
        """nvdp_device_allocated for the client at `peer`."""
        pods = self.shows_pods(peer)
        family = MetricFamily(
            "nvdp_device_allocated",
            "1 while a container holds the device (from the kubelet's PodResources API); labelled with"
            " the pod only for clients --pod-detail allows.",
            "gauge",
            ["resource", "device", "gpu_uuid", *(["namespace", "pod", "container"] if pods else [])],
        )
        for resource, devices in self.document(METRICS_MAX_AGE_S, pods=pods)["resources"].items():
            for device in devices:
                labels = [resource, device["device"], device["gpu"] or ""]
                if not pods:
                    if device["holders"]:
                        family.add(labels, 1.0)
                    continue
                for pod in device["pods"]:
                    family.add([*labels, pod["namespace"], pod["name"], pod["container"]], 1.0)
        return [family]
