"""The ResourceSlices that publish this node's pool (pure): resource.k8s.io/v1 objects.

- One pool per node, named after it, in slices `<node>-gpu.nvidia.com-<n>` of at most
  MAX_DEVICES_PER_SLICE devices (`resourceSliceCount` says how many), all of one `generation`.
- A pool without devices is one empty slice, as NVIDIA's driver publishes it.
- An Unhealthy device carries a `NoSchedule` taint `gpu.nvidia.com/unhealthy` (no new claim gets it;
  running pods keep it), or, where the server drops device taints (`nvdp.plugins.dra.publisher` finds out),
  is left out until it recovers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.names import DRIVER_NAME

API_GROUP = "resource.k8s.io"
MAX_DEVICES_PER_SLICE = 64  # the API's limit for a slice whose devices carry taints or consume counters
MAX_COUNTER_SETS = 8  # the API's limit of counter sets in one slice
UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
_NOT_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")

Slice = dict[str, Any]


@dataclass(frozen=True)
class Taint:
    """Why a device is Unhealthy, as its taint says it: a label-value `value` ("xid-79") and the
    time (RFC 3339) it became so."""

    value: str
    time_added: str

    @classmethod
    def of(cls, reason: str, xid: int | None, time_added: str) -> Taint:
        text = f"xid-{xid}" if xid is not None else reason
        value = _NOT_LABEL_VALUE.sub("-", text).strip("-_.")[:63].strip("-_.")
        return cls(value or "unhealthy", time_added)

    def entry(self) -> dict[str, str]:
        return {
            "key": UNHEALTHY_TAINT,
            "value": self.value,
            "effect": "NoSchedule",
            "timeAdded": self.time_added,
        }


def slice_name(node: str, n: int) -> str:
    return f"{node}-{DRIVER_NAME}-{n}"


def pool_slices(
    node: str,
    generation: int,
    devices: Sequence[DraDevice],
    unhealthy: Mapping[str, Taint],
    *,
    taints: bool,
    owner: Mapping[str, Any] | None = None,
) -> list[Slice]:
    """The pool's slices: `devices` (by name order of the inventory), those named in `unhealthy`
    tainted (`taints`) or left out (not `taints`); owned by `owner` (the Node: they go with it). No
    devices: one slice without any. Counter sets the devices consume from: slices of their own first.
    """
    entries = []
    for device in devices:
        entry = device.slice_entry()
        taint = unhealthy.get(device.name)
        if taint is not None:
            if not taints:
                continue
            entry = {**entry, "taints": [taint.entry()]}
        entries.append(entry)
    chunks = [entries[i : i + MAX_DEVICES_PER_SLICE] for i in range(0, len(entries), MAX_DEVICES_PER_SLICE)]
    bodies: list[dict[str, Any]] = [{"sharedCounters": sets} for sets in counter_sets(devices)]
    bodies += [{"devices": chunk} for chunk in chunks or [[]]]
    return [
        {
            "apiVersion": f"{API_GROUP}/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node, n),
                **({"ownerReferences": [dict(owner)]} if owner else {}),
            },
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(bodies)},
                **body,
            },
        }
        for n, body in enumerate(bodies)
    ]


def counter_sets(devices: Sequence[DraDevice]) -> list[list[Mapping[str, Any]]]:
    """The counter sets the devices consume from, MAX_COUNTER_SETS a slice: since Kubernetes 1.35 a
    slice holds `sharedCounters` or `devices`, not both (the devices of the pool's other slices name
    the sets); these slices come first."""
    sets = list({d.counter_set["name"]: d.counter_set for d in devices if d.counter_set}.values())
    return [sets[i : i + MAX_COUNTER_SETS] for i in range(0, len(sets), MAX_COUNTER_SETS)]


def same_content(published: Slice, wanted: Slice) -> bool:
    """Whether a slice read back from the server says what `wanted` says (its owner, devices and pool
    but the generation; fields the server adds are not compared)."""
    spec, want = published.get("spec") or {}, wanted["spec"]
    pool = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    wanted_pool = {k: v for k, v in want["pool"].items() if k != "generation"}
    owners = (published.get("metadata") or {}).get("ownerReferences") or []
    return (
        owners == (wanted["metadata"].get("ownerReferences") or [])
        and spec.get("driver") == want["driver"]
        and spec.get("nodeName") == want["nodeName"]
        and pool == wanted_pool
        and (spec.get("devices") or []) == want.get("devices", [])
        and (spec.get("sharedCounters") or []) == want.get("sharedCounters", [])
    )


def generation_of(published: Slice) -> int:
    generation = ((published.get("spec") or {}).get("pool") or {}).get("generation")
    return generation if isinstance(generation, int) else 0
