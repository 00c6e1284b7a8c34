"""A GPU shared by consumable capacity (KEP-5075, resource.k8s.io/v1; beta and on by default from
Kubernetes 1.36, gate DRAConsumableCapacity) (pure).

- Published: a GPU `dra.consumableCapacity` names is its one `gpu` device with
  `allowMultipleAllocations: true` and two capacities, each with a `requestPolicy` (the scheduler
  charges a claim the whole of a capacity without one).
- `memory`: the GPU's memory; default 1Gi, validRange min 1Gi, step 1Gi (1500Mi asked: 2Gi taken).
- `compute`: 100, a percentage of the GPU's SMs; default 0 (no cap), validRange min 0, step 1.
- Prepared: each result on such a device carries the claim's `consumedCapacity` (and a `shareID`);
  the claim's containers are MPS clients of the GPU's daemon (`nvdp.plugins.dra.capacity_mps`, through
  `nvdp.plugins.dra.mps`) limited to it: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<GPU uuid>=<MiB>M`, and
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE when the claim consumes compute.
- A result without `consumedCapacity` (a server that drops the field) takes the whole GPU.
- One claim's shares are of one GPU (an MPS client reaches one daemon).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nvdp.base.units import MIB, parse_quantity
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.dra.claims import ClaimError
from nvdp.plugins.dra.devices import DraDevice, quantity
from nvdp.plugins.dra.names import GPU_TYPE

MEMORY = "memory"
COMPUTE = "compute"
MEMORY_STEP = 1 << 30  # 1Gi: the default, the least and the step of a memory share
COMPUTE_TOTAL = 100  # percent of the GPU's SMs


def request_policies(memory_bytes: int) -> dict[str, dict[str, Any]]:
    """The capacities of a GPU shared by capacity, as its slice entry lists them."""
    step = quantity(MEMORY_STEP)["value"]
    return {
        MEMORY: {
            "value": quantity(memory_bytes)["value"],
            "requestPolicy": {"default": step, "validRange": {"min": step, "step": step}},
        },
        COMPUTE: {
            "value": str(COMPUTE_TOTAL),
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
        },
    }


def shared_by_capacity(devices: Sequence[DraDevice], gpus: Collection[str]) -> list[DraDevice]:
    """`devices` with each whole GPU of `gpus` (uuids) made shared by capacity (MIG devices and
    the other GPUs as they are)."""
    return [
        replace(
            d,
            capacity=request_policies(parse_quantity(d.capacity[MEMORY]["value"])),
            allow_multiple_allocations=True,
        )
        if d.type == GPU_TYPE and d.gpu_uuid in gpus and MEMORY in d.capacity
        else d
        for d in devices
    ]


def unshared(device: DraDevice) -> DraDevice:
    """A GPU shared by capacity as a whole device (its memory, no policies)."""
    if not device.allow_multiple_allocations:
        return device
    return replace(
        device,
        capacity={MEMORY: {"value": device.capacity[MEMORY]["value"]}},
        allow_multiple_allocations=False,
    )


def kept_shared(
    configured: Collection[str], before: Collection[str], held: Collection[str]
) -> frozenset[str]:
    """The GPUs to share by capacity now (uuids): those configured, but one a prepared claim holds
    whole (not shared before) only once it is unprepared; and those shared before that a prepared
    claim still holds (a GPU with shares is never published whole until they are unprepared)."""
    configured, before, held = frozenset(configured), frozenset(before), frozenset(held)
    return (configured - (held - before)) | (before & held)


def capacity_misfits(gpus: Sequence[GpuInfo], shared: Collection[str]) -> tuple[Misfit, ...]:
    """A GPU to share by capacity with MIG mode on: its MIG devices are published as they are."""
    on = [g for g in sorted(gpus, key=lambda g: g.index) if g.uuid in shared and g.mig_enabled]
    return tuple(
        Misfit(
            "DraSharingMisfit",
            f"GPU {g.index}",
            f"dra.consumableCapacity: GPU {g.index} left out: MIG mode is on (its MIG devices are published)",
        )
        for g in on
    )


@dataclass(frozen=True)
class Share:
    """One claim's share of one GPU: its device and what it consumes."""

    device: str
    gpu_uuid: str
    memory_bytes: int
    compute: int  # percent; 0: no cap

    def describe(self) -> str:
        compute = f", compute {self.compute}%" if self.compute else ""
        return f"{self.device}: memory {quantity(self.memory_bytes)['value']}{compute}"


def share_of(device: DraDevice, consumed: Mapping[str, object] | None, claim: str) -> Share:
    """What a claim's result on a shared `device` consumes (None: the server dropped the field; the
    whole GPU). Raises ClaimError for a consumed capacity that is no quantity or exceeds the GPU."""
    total = {name: parse_quantity(c["value"]) for name, c in device.capacity.items()}
    if consumed is None:
        return Share(device.name, device.gpu_uuid, total[MEMORY], COMPUTE_TOTAL)
    amounts = {}
    for name in (MEMORY, COMPUTE):
        value = consumed.get(name, "0")
        try:
            amounts[name] = parse_quantity(value)
        except ValueError:
            raise ClaimError(
                f"ResourceClaim {claim}: consumedCapacity {name} {value!r} of {device.name} is no quantity"
            ) from None
        if not 0 <= amounts[name] <= total[name]:
            raise ClaimError(
                f"ResourceClaim {claim}: consumedCapacity {name} {value} of {device.name} is outside "
                f"0..{device.capacity[name]['value']}"
            )
    if amounts[MEMORY] < MIB:
        raise ClaimError(f"ResourceClaim {claim}: consumedCapacity memory of {device.name} is under 1Mi")
    return Share(device.name, device.gpu_uuid, amounts[MEMORY], amounts[COMPUTE])


def one_gpu(shares: Sequence[Share], claim: str) -> str | None:
    """The one GPU of a claim's shares (None without shares). Raises ClaimError for shares of
    several GPUs: an MPS client reaches one control daemon."""
    gpus = sorted({s.gpu_uuid for s in shares})
    if len(gpus) > 1:
        devices = ", ".join(sorted(s.device for s in shares))
        raise ClaimError(
            f"ResourceClaim {claim}: shares of {len(gpus)} GPUs ({devices}); a claim's shares must be "
            "of one GPU (its containers are clients of one MPS control daemon)"
        )
    return gpus[0] if gpus else None
