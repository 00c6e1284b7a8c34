"""Devices this node cannot hand out right now, left out of every resource (pure).

- A GPU or MIG device whose device node is missing under the dev root, or whose CDI name is not in
  the spec on disk, is left out with its replicas: advertised, it would fail in the runtime.
- It is left out, not advertised Unhealthy: health is the monitor's and recovers on its own; a
  missing node only the node can fix, and the device returns on the next apply once it is
  (`nvdp.plugins.deviceplugin.device_nodes`).
- Each distinct fact is one `Misfit` naming the devices it takes out; a resource left with no
  device is in the misfit's `withholds` (the daemon is not ready meanwhile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from nvdp.node.gpus.devices import Device, DeviceSet, device_names
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import NodeResources, Resource


@dataclass(frozen=True)
class Unusable:
    """Why a device (by its GPU or MIG uuid) cannot be handed out: the misfit's reason and subject,
    and `why`, the fact in words (`/dev/nvidia3 not found under the dev root /`)."""

    reason: str
    subject: str
    why: str


def leave_out(resources: Sequence[Resource], unusable: Mapping[str, Unusable]) -> NodeResources:
    """`resources` without the devices (replicas included) whose uuid is in `unusable`; one misfit per
    distinct fact, naming the devices it took out and the resources it left with none."""
    kept: list[Resource] = []
    taken: dict[Unusable, dict[str, Device]] = {}  # fact -> uuid -> one device of that uuid
    emptied: dict[Unusable, list[str]] = {}
    for resource in resources:
        devices = list(resource.devices.values())
        left = [d for d in devices if d.uuid not in unusable]
        for device in devices:
            if device.uuid in unusable:
                taken.setdefault(unusable[device.uuid], {}).setdefault(device.uuid, device)
        if len(left) == len(devices):
            kept.append(resource)
            continue
        if not left:
            for fact in dict.fromkeys(unusable[d.uuid] for d in devices):
                emptied.setdefault(fact, []).append(resource.name)
            continue
        uuids = {d.uuid for d in left}
        counts = {u: n for u, n in resource.replica_counts.items() if u in uuids}
        kept.append(
            replace(
                resource,
                devices=DeviceSet(left),
                replica_counts=counts,
                replicas=min(counts.values()) if counts else resource.replicas,
            )
        )
    misfits = tuple(
        Misfit(
            fact.reason,
            fact.subject,
            f"{_named(list(devices.values()))}: {fact.why}; not advertised",
            withholds=tuple(emptied.get(fact, ())),
        )
        for fact, devices in taken.items()
    )
    return NodeResources(kept, misfits)


def _named(devices: Sequence[Device]) -> str:
    """`GPU 3 (GPU-...)` for one device; `GPU 3 and MIG devices 3:0, 3:1` for several."""
    if len(devices) == 1:
        device = devices[0]
        return f"{'MIG device' if device.is_mig else 'GPU'} {device.index} ({device.uuid})"
    return device_names(devices)
