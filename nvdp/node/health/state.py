"""The node's device health as a state machine: NVML events, probe outcomes and times in, changes out.

- No threads, NVML calls or clock of its own: the monitor thread (`nvdp.node.health.monitor`) hands in
  NVML's answers and its clock; every call returns the `HealthChange`s it caused.
- Its only side effect is the log line explaining a decision (an ignored event, a probe that stops
  or starts answering).
- Units are GPU and MIG uuids. An event on a GPU marks the GPU and, when MIG-enabled, the MIG
  devices whose GPU / compute instance ids match (all of them when the event names no instance).
- A lost GPU marks all its units, for good (fatal).
- A unit marked by a non-fatal cause recovers when a probe of its GPU passes `recovery_quiet_period`
  seconds after its last event, unless a page retirement or row remap waits for a reset.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from nvdp.base.logs import log_event
from nvdp.node.health.types import HealthChange
from nvdp.node.health.xid import XidPolicy
from nvdp.node.nvml.types import EventType, GpuInfo, MigDeviceInfo, NvmlEvent, ProbeResult

log = logging.getLogger(__name__)

GPU_LOST_REASON = "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
ENUMERATION_FAILED_REASON = "GPU enumeration failed"
ROW_REMAP_FAILURE_REASON = "row remapping failed (the GPU needs service)"
RECOVERED_REASON = "no critical event in the quiet period and the probe passed"


@dataclass(frozen=True)
class ProbeFailed:
    """The probe's NVML call failed with `code`: the GPU's health cannot be told (no marking, no
    recovery)."""

    code: str


@dataclass(frozen=True)
class GpuLost:
    """NVML answered NVML_ERROR_GPU_IS_LOST."""


ProbeOutcome = ProbeResult | ProbeFailed | GpuLost


@dataclass
class Unit:
    uuid: str
    gpu_uuid: str
    healthy: bool = True
    fatal: bool = False
    last_event: float = 0.0
    fault: HealthChange | None = None  # what holds it Unhealthy: the marking, or a fatal cause after it


class HealthState:
    """The health of every GPU and MIG unit of one node. Not thread-safe, except `unhealthy()`: one
    thread (the monitor's) drives it."""

    def __init__(self, gpus: Sequence[GpuInfo], policy: XidPolicy, recovery_quiet_period: float) -> None:
        self.policy = policy
        self.recovery_quiet_period = recovery_quiet_period
        self._units: dict[str, Unit] = {}
        self._probe_errors: dict[str, str] = {}  # GPU uuid -> the NVML error code of its failing probe
        self.set_gpus(gpus)

    @property
    def gpus(self) -> list[GpuInfo]:
        return self._gpus

    def set_rules(self, policy: XidPolicy, recovery_quiet_period: float) -> None:
        """New health settings: units keep their state; later inputs follow the new rules."""
        self.policy = policy
        self.recovery_quiet_period = recovery_quiet_period

    def set_gpus(self, gpus: Sequence[GpuInfo], forget: Collection[str] = ()) -> None:
        """A new enumeration (reload, MIG change): units still present keep their state, except those
        in `forget` (gone from the node in between: a device that comes back is a new one)."""
        old = self._units
        units: dict[str, Unit] = {}
        self._gpus = list(gpus)
        self._gpu_by_uuid = {g.uuid: g for g in self._gpus}
        self._mig_by_uuid: dict[str, MigDeviceInfo] = {}
        for gpu in self._gpus:
            units[gpu.uuid] = (None if gpu.uuid in forget else old.get(gpu.uuid)) or Unit(gpu.uuid, gpu.uuid)
            for mig in gpu.mig_devices:
                self._mig_by_uuid[mig.uuid] = mig
                units[mig.uuid] = (None if mig.uuid in forget else old.get(mig.uuid)) or Unit(
                    mig.uuid, gpu.uuid
                )
        self._units = units

    def unhealthy(self) -> dict[str, bool]:
        """uuid -> fatal, for every unit held Unhealthy. Safe to call from any thread."""
        return {u.uuid: u.fatal for u in list(self._units.values()) if not u.healthy}

    def faults(self) -> dict[str, HealthChange]:
        """uuid -> what holds the unit Unhealthy (a fatal cause that came after a non-fatal marking
        replaces it), for every unit held Unhealthy. Safe to call from any thread."""
        units = list(self._units.values())
        return {u.uuid: u.fault for u in units if not u.healthy and u.fault is not None}

    # ---- inputs ----------------------------------------------------------------------------

    def event(self, event: NvmlEvent, now: float) -> list[HealthChange]:
        """One NVML event at time `now`, judged by the XID policy and attributed to units."""
        is_xid = bool(event.event_type & EventType.XID_CRITICAL)
        verdict = self.policy.classify(event)
        xid = event.data if is_xid else None
        if not verdict.marks_unhealthy:
            log_event(
                log, logging.INFO, "ignoring health event", gpu=event.gpu_uuid, xid=xid, reason=verdict.reason
            )
            return []
        units = self._attribute(event)
        if not units:
            log_event(
                log, logging.INFO, "ignoring event for an unmonitored device", gpu=event.gpu_uuid, xid=xid
            )
            return []
        return self._mark(units, verdict.reason, xid, verdict.fatal, now)

    def gpu_lost(self, gpu_uuid: str, now: float) -> list[HealthChange]:
        """NVML says the GPU is lost (at arming or probing): all its units, fatal."""
        return self._mark(self._gpu_units(gpu_uuid), GPU_LOST_REASON, None, True, now)

    def enumeration_faults(self, now: float) -> list[HealthChange]:
        """GPUs NVML could not enumerate (`GpuInfo.fault`): Unhealthy and fatal, like a lost GPU."""
        changes: list[HealthChange] = []
        for gpu in self._gpus:
            if gpu.fault is not None:
                reason = f"{ENUMERATION_FAILED_REASON}: {gpu.fault}"
                changes += self._mark(self._gpu_units(gpu.uuid), reason, None, True, now)
        return changes

    def probed(self, gpu_uuid: str, outcome: ProbeOutcome, now: float) -> list[HealthChange]:
        """The outcome of one GPU's probe at time `now`: a finding marks, a clean pass may recover."""
        gpu = self._gpu_by_uuid[gpu_uuid]
        self._probe_state(gpu, outcome.code if isinstance(outcome, ProbeFailed) else None)
        if isinstance(outcome, GpuLost):
            return self.gpu_lost(gpu_uuid, now)
        if isinstance(outcome, ProbeFailed):
            return []
        if outcome.row_remap_failure:
            return self._mark(self._gpu_units(gpu_uuid), ROW_REMAP_FAILURE_REASON, None, True, now)
        quiet = self.recovery_quiet_period
        if outcome.retired_pages_pending or outcome.row_remap_pending or quiet <= 0:
            return []  # a pending retirement/remap is applied by a reset only: no recovery yet
        changes = []
        for unit in self._gpu_units(gpu_uuid):
            if not unit.healthy and not unit.fatal and now - unit.last_event >= quiet:
                unit.healthy, unit.fault = True, None
                changes.append(HealthChange(unit.uuid, True, RECOVERED_REASON, None, False, now))
        return changes

    # ---- internals -------------------------------------------------------------------------

    def _gpu_units(self, gpu_uuid: str, migs: Sequence[MigDeviceInfo] | None = None) -> list[Unit]:
        gpu = self._gpu_by_uuid[gpu_uuid]
        chosen = gpu.mig_devices if migs is None else migs
        return [self._units[gpu.uuid]] + [self._units[m.uuid] for m in chosen]

    def _attribute(self, event: NvmlEvent) -> list[Unit]:
        gpu = self._gpu_by_uuid.get(event.gpu_uuid)
        if gpu is None:
            mig = self._mig_by_uuid.get(event.gpu_uuid)
            return [] if mig is None else self._gpu_units(mig.parent_uuid, [mig])
        if not gpu.mig_devices or (event.gi_id is None and event.ci_id is None):
            return self._gpu_units(gpu.uuid)
        matched = [
            m
            for m in gpu.mig_devices
            if (event.gi_id is None or m.gi_id == event.gi_id)
            and (event.ci_id is None or m.ci_id == event.ci_id)
        ]
        if not matched:
            log_event(
                log,
                logging.WARNING,
                "event names no known MIG instance; marking the whole GPU",
                gpu=gpu.uuid,
                gi=event.gi_id,
                ci=event.ci_id,
            )
            return self._gpu_units(gpu.uuid)
        return self._gpu_units(gpu.uuid, matched)

    @staticmethod
    def _mark(
        units: Sequence[Unit], reason: str, xid: int | None, fatal: bool, now: float
    ) -> list[HealthChange]:
        changes = []
        for unit in units:
            unit.last_event = now
            if unit.healthy:
                change = HealthChange(unit.uuid, False, reason, xid, fatal, now)
                unit.fault, unit.healthy, unit.fatal = change, False, fatal
                changes.append(change)
            elif fatal and not unit.fatal:
                unit.fault = HealthChange(unit.uuid, False, reason, xid, True, now)
                unit.fatal = True
        return changes

    def _probe_state(self, gpu: GpuInfo, code: str | None) -> None:
        before = self._probe_errors.get(gpu.uuid)
        if code == before:
            return
        if code is None:
            del self._probe_errors[gpu.uuid]
            log_event(log, logging.INFO, "health probe answers again", gpu=gpu.uuid, index=gpu.index)
        else:
            self._probe_errors[gpu.uuid] = code
            log_event(
                log,
                logging.WARNING,
                "health probe failed; no recovery until it passes",
                gpu=gpu.uuid,
                index=gpu.index,
                code=code,
            )
