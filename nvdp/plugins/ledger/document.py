"""The ledger as a JSON document (pure): the metrics endpoint's /allocations page, what `nvdp status`
reads and `nvdp simulate` prints.

    {"source": ".../pod-resources/kubelet.sock", "readAt": "...", "ageSeconds": 1.5, "problem": null,
     "resources": {"nvidia.com/gpu": [{"device": "GPU-...::1", "gpu": "GPU-...", "uuid": "GPU-...",
       "index": "3", "advertised": true, "health": "Unhealthy", "reason": "GPU has fallen off the bus",
       "pods": [{"namespace": "ml", "name": "train-0", "uid": "...", "container": "main"}]}]}}

- Per resource, every advertised device (and any held but no longer advertised), located among the
  served devices, else the node's GPUs (`nvdp.plugins.ledger.locate`).
- Without pod detail (--pod-detail): top-level `"podDetail": "withheld"`, and `"holders": <count>`
  in place of each device's `pods`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvdp.node.gpus.devices import Device
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.ledger.locate import locate
from nvdp.plugins.ledger.types import Holding, LedgerSnapshot

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
WITHHELD = "withheld"  # "podDetail": the pods holding devices are not told to this client


@dataclass(frozen=True)
class Served:
    """One resource as the plugin serves it: its devices and their advertised health (ID ->
    Healthy)."""

    devices: Mapping[str, Device]
    health: Mapping[str, bool]


def allocations_document(
    snapshot: LedgerSnapshot,
    served: Mapping[str, Served],
    reasons: Mapping[str, str],
    gpus: Sequence[GpuInfo],
    now: float,
    *,
    pods: bool = True,
) -> dict[str, Any]:
    """The document of `snapshot` over the `served` resources; `reasons`: GPU/MIG uuid -> why it is
    Unhealthy; `now`: time.time(); without `pods`, only how many containers hold each device."""
    held: dict[str, dict[str, list[Holding]]] = {}
    for holding in snapshot.holdings:
        held.setdefault(holding.resource, {}).setdefault(holding.device_id, []).append(holding)
    resources: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(served.keys() | held.keys()):
        resource = served.get(name, Served({}, {}))
        holders = held.get(name, {})
        ids = [*resource.devices, *(i for i in holders if i not in resource.devices)]
        resources[name] = [_device(i, resource, holders.get(i, []), reasons, gpus, pods) for i in ids]
    read_at = snapshot.read_at
    return {
        "source": snapshot.source,
        "readAt": _timestamp(read_at) if read_at is not None else None,
        "ageSeconds": round(max(now - read_at, 0.0), 3) if read_at is not None else None,
        "problem": snapshot.problem,
        **({} if pods else {"podDetail": WITHHELD}),
        "resources": resources,
    }


def _device(
    device_id: str,
    resource: Served,
    holders: list[Holding],
    reasons: Mapping[str, str],
    gpus: Sequence[GpuInfo],
    pods: bool,
) -> dict[str, Any]:
    where = locate(device_id, resource.devices, gpus)
    advertised = device_id in resource.health
    health = UNKNOWN if not advertised else HEALTHY if resource.health[device_id] else UNHEALTHY
    entry: dict[str, Any] = {
        "device": device_id,
        "gpu": where.gpu_uuid if where else None,
        "uuid": where.uuid if where else None,
        "index": where.index if where else None,
        "advertised": advertised,
        "health": health,
    }
    if health == UNHEALTHY:
        entry["reason"] = reasons.get(where.uuid, "unknown") if where else "unknown"
    if not pods:
        entry["holders"] = len(holders)
        return entry
    entry["pods"] = [
        {"namespace": h.namespace, "name": h.pod, "uid": h.uid, "container": h.container} for h in holders
    ]
    return entry


def _timestamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
