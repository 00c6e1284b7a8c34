"""What the Node should say about its GPUs' health (pure): the `nvidia.com/GpuHealthy` condition and,
when asked for, the `nvidia.com/gpu-unhealthy` taint, from the faults the health monitor holds.

- False when a unit has a *fatal* fault (one that stays until a GPU reset or reboot:
  `nvdp.node.health.xid`), with reason `GpuLost` (lost or not enumerable) or `FatalXid` (a fatal XID, a
  double-bit ECC error or a failed row remap: XIDs 48 and 64) and a message naming the GPUs.
- It stays False until every GPU is healthy again; a fault that recovers by itself never sets it.
- Unknown (`MonitorDegraded`) while the monitor has failed beyond its grace period and no fatal
  fault is known; otherwise True (`GpusHealthy`).
- The taint goes with a False condition where no GPU is left healthy (a GPU with MIG devices counts
  as healthy while one of them is); its value is the condition's reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvdp.node.health.state import ENUMERATION_FAILED_REASON, GPU_LOST_REASON
from nvdp.node.health.types import HealthChange
from nvdp.node.nvml.types import GpuInfo

CONDITION_TYPE = "nvidia.com/GpuHealthy"
TAINT_KEY = "nvidia.com/gpu-unhealthy"
HEALTHY = "GpusHealthy"
FATAL_XID = "FatalXid"
GPU_LOST = "GpuLost"
MONITOR_DEGRADED = "MonitorDegraded"
MAX_NAMED = 8  # GPUs a message names; the others are counted


@dataclass(frozen=True)
class GpuHealthCondition:
    """The condition's status ("True", "False", "Unknown"), reason and message, and the taint's value
    (None: no taint)."""

    status: str
    reason: str
    message: str
    taint: str | None = None


def gpu_health_condition(
    gpus: Sequence[GpuInfo],
    faults: Mapping[str, HealthChange],
    *,
    monitor_failing: str | None = None,
    before: GpuHealthCondition | None = None,
    taint: bool = False,
) -> GpuHealthCondition:
    """The condition for the GPUs `gpus`, the faults by unit uuid (`HealthState.faults()`), why the
    monitor fails (`MonitorStatus.failing`), and the condition said `before`; `taint` asks for the
    taint."""
    fatal: dict[str, HealthChange] = {}  # GPU uuid -> its fatal fault: the GPU's own, else a MIG device's
    for gpu in gpus:
        found = [faults.get(uuid) for uuid in (gpu.uuid, *(m.uuid for m in gpu.mig_devices))]
        first = next((f for f in found if f is not None and f.fatal), None)
        if first is not None:
            fatal[gpu.uuid] = first
    if fatal:
        reason = GPU_LOST if any(_lost(f) for f in fatal.values()) else FATAL_XID
        down = not any(_serves(g, faults) for g in gpus)
        return GpuHealthCondition(
            "False", reason, _fatal_message(gpus, fatal), reason if taint and down else None
        )
    if monitor_failing is not None:
        return GpuHealthCondition("Unknown", MONITOR_DEGRADED, monitor_failing)
    if faults and before is not None and before.status == "False":
        return GpuHealthCondition(before.status, before.reason, before.message)  # until all are healthy
    count = len(gpus)
    return GpuHealthCondition("True", HEALTHY, f"{count} GPU{'' if count == 1 else 's'} healthy")


def condition_body(
    condition: GpuHealthCondition, current: Mapping[str, Any] | None, now: str
) -> dict[str, Any] | None:
    """The condition to write over `current` (the Node's, None when absent) at `now` (RFC 3339), or
    None when the Node already says it. lastTransitionTime moves only when the status changes."""
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
        condition.status,
        condition.reason,
        condition.message,
    ):
        return None
    transition = now
    if (
        current is not None
        and current.get("status") == condition.status
        and current.get("lastTransitionTime")
    ):
        transition = str(current["lastTransitionTime"])
    return {
        "type": CONDITION_TYPE,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    }


def taints_with(
    current: Sequence[Mapping[str, Any]], value: str | None, effect: str | None, now: str
) -> list[dict[str, Any]] | None:
    """The Node's taints with nvdp's (`value`, `effect`; None for either: without it), or None when
    they already are so. Other clients' taints are kept as they are, in their order."""
    others = [dict(t) for t in current if t.get("key") != TAINT_KEY]
    ours = [t for t in current if t.get("key") == TAINT_KEY]
    if value is None or effect is None:
        return others if ours else None
    if [(t.get("value"), t.get("effect")) for t in ours] == [(value, effect)]:
        return None
    added = {"key": TAINT_KEY, "value": value, "effect": effect}
    return [*others, {**added, "timeAdded": now} if effect == "NoExecute" else added]


def _lost(fault: HealthChange) -> bool:
    return fault.reason == GPU_LOST_REASON or fault.reason.startswith(ENUMERATION_FAILED_REASON)


def _serves(gpu: GpuInfo, faults: Mapping[str, HealthChange]) -> bool:
    """Whether something of the GPU is still healthy: the GPU, or one of its MIG devices."""
    units = [m.uuid for m in gpu.mig_devices] or [gpu.uuid]
    return any(uuid not in faults for uuid in units)


def _fatal_message(gpus: Sequence[GpuInfo], fatal: Mapping[str, HealthChange]) -> str:
    named = [g for g in gpus if g.uuid in fatal]
    parts = []
    for gpu in named[:MAX_NAMED]:
        fault = fatal[gpu.uuid]
        cause = fault.reason if fault.xid is None else f"XID {fault.xid} ({fault.reason})"
        parts.append(f"GPU {gpu.index} {gpu.uuid}: {cause}")
    if len(named) > MAX_NAMED:
        parts.append(f"and {len(named) - MAX_NAMED} more")
    return (
        f"{len(named)} of {len(gpus)} GPUs have a fatal fault, kept until a GPU reset or a reboot: "
        + "; ".join(parts)
    )
