"""GPUs whose MIG devices are made per claim (`dra.dynamicMig`), published as partitionable devices
(KEP-4815 `sharedCounters` / `consumesCounters`) as NVIDIA's DRA driver's DynamicMIG does (pure).

- Per GPU a counter set `gpu-<minor>-counter-set`: `memory` (bytes), `multiprocessors`,
  `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines` (the whole GPU's), and
  `memory-slice-<n>` (1) per memory slice.
- Per placement of each profile whose GPU instance is one compute instance, one `mig` device named
  as the MIG device it becomes (`gpu-0-mig-1g5gb-19-3`), with the parent's attributes (no `uuid`),
  its capacities, consuming them and its placement's memory slices: overlapping ones never both fit.
- The whole GPU is not offered (MIG stays on; `7g.40gb` is the whole GPU's share).
- MIG devices no claim made (`foreign`) stay; their slices are 0 and their share leaves the counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo, MigEngines, MigPlacement, MigProfileInfo
from nvdp.plugins.dra.devices import Attributes, DraDevice, DriverFacts, _common, quantity
from nvdp.plugins.dra.names import MIG_TYPE, gpu_device_name, mig_device_name

# capacity name -> counter name (a DNS label: NVIDIA's camelCase made kebab-case)
COUNTERS = (
    ("memory", "memory"),
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
)


def counter_set_name(gpu: GpuInfo) -> str:
    return f"{gpu_device_name(gpu)}-counter-set"


def memory_slice(n: int) -> str:
    return f"memory-slice-{n}"


def shares(memory_bytes: int, engines: MigEngines | None) -> dict[str, int]:
    """A MIG device's share of its GPU by capacity name."""
    e = engines or MigEngines(0, 0, 0, 0, 0, 0)
    counts = (e.multiprocessors, e.copy_engines, e.decoders, e.encoders, e.jpeg_engines, e.ofa_engines)
    return {"memory": memory_bytes, **dict(zip((c for c, _ in COUNTERS[1:]), counts, strict=True))}


def placement_device(gpu: GpuInfo, profile: MigProfileInfo, placement: MigPlacement) -> MigDeviceInfo:
    """The MIG device a placement becomes, as far as known before it is made (no uuid, GI id 0)."""
    return MigDeviceInfo(
        uuid="",
        index=0,
        gi_id=0,
        ci_id=0,
        profile=profile.name,
        memory_bytes=profile.memory_bytes,
        parent_uuid=gpu.uuid,
        parent_index=gpu.index,
        placement=placement,
        engines=profile.engines,
    )


def partitions(
    gpu: GpuInfo,
    profiles: Sequence[MigProfileInfo],
    facts: DriverFacts,
    foreign: Iterable[MigDeviceInfo] = (),
) -> list[DraDevice]:
    """The GPU's placement devices, each carrying the GPU's counter set; [] without profiles."""
    if not profiles:
        return []
    whole = {name: max(shares(p.memory_bytes, p.engines)[name] for p in profiles) for name, _ in COUNTERS}
    slices = max(w.start + w.size for p in profiles for w in p.placements)
    counters = {counter: whole[name] for name, counter in COUNTERS} | {
        memory_slice(n): 1 for n in range(slices)
    }
    for mig in {m.gi_id: m for m in foreign}.values():  # one per GPU instance
        for name, counter in COUNTERS:
            counters[counter] = max(0, counters[counter] - shares(mig.memory_bytes, mig.engines)[name])
        if mig.placement is not None:
            for n in range(mig.placement.start, mig.placement.start + mig.placement.size):
                counters[memory_slice(n)] = 0
    set_name = counter_set_name(gpu)
    counter_set = {"name": set_name, "counters": _values(counters)}
    common = _common(gpu, facts)
    devices = []
    for profile in profiles:
        attributes: Attributes = {
            "type": {"string": MIG_TYPE},
            "parentUUID": {"string": gpu.uuid},
            "profile": {"string": profile.name},
            **common,
        }
        share = shares(profile.memory_bytes, profile.engines)
        capacity = {name: quantity(share[name]) for name, _ in COUNTERS}
        for where in profile.placements:
            consumed = {counter: share[name] for name, counter in COUNTERS}
            consumed |= {memory_slice(n): 1 for n in range(where.start, where.start + where.size)}
            devices.append(
                DraDevice(
                    mig_device_name(gpu, placement_device(gpu, profile, where)),
                    gpu.uuid,
                    gpu.uuid,
                    (),
                    attributes,
                    capacity,
                    placement=where,
                    counter_set=counter_set,
                    consumes={"counterSet": set_name, "counters": _values(consumed)},
                )
            )
    return devices


def _values(counters: Mapping[str, int]) -> dict[str, Any]:
    return {name: quantity(value) for name, value in counters.items()}
