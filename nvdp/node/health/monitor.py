"""The node's health monitor thread: one NVML event set for every GPU, an active probe, re-arming.

The thread waits on the event set up to `wait_timeout` (5 s, as NVIDIA's plugin: an idle node costs
one wake-up per wait; an event returns the wait at once, and so do a stop and a new enumeration or
settings, which interrupt it where NVML can: the simulated node; real NVML's wait ends at its
timeout, so a stop does not wait for it) and, every
`probe_interval`, makes one cheap query per GPU on the same long-lived NVML session. What NVML says
goes to the health state machine (`nvdp.node.health.state`, which decides what is healthy); the changes
it returns go to a listener (normally `HealthRouter`) in batches, from the monitor thread.

NVML failures are not device failures: a failed wait leaves every unit as it is, marks the monitor
degraded, and the event set is closed and re-created with backoff until it arms again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from nvdp.base.backoff import Backoff
from nvdp.base.errors import GpuLostError, NvmlError, NvmlNotSupported
from nvdp.base.logs import log_event
from nvdp.base.units import format_go_duration
from nvdp.node.health.state import (
    GPU_LOST_REASON,
    RECOVERED_REASON,
    ROW_REMAP_FAILURE_REASON,
    GpuLost,
    HealthState,
    ProbeFailed,
    ProbeOutcome,
)
from nvdp.node.health.types import HealthChange, HealthSettings, MonitorStatus
from nvdp.node.health.xid import XidPolicy
from nvdp.node.nvml.types import EventSet, EventType, GpuInfo, Nvml, NvmlEvent

log = logging.getLogger(__name__)

Listener = Callable[[Sequence[HealthChange]], None]

__all__ = [
    "GPU_LOST_REASON",
    "RECOVERED_REASON",
    "ROW_REMAP_FAILURE_REASON",
    "HealthMonitor",
    "Listener",
]

_MAX_BATCH = 64  # events drained from the set into one batch
# The longest wait on the event set: what an idle node's monitor costs (a wake-up per wait) and, on
# real NVML, how long a stop or an update can wait for the wait to end (NVIDIA's plugin waits 5 s).
WAIT_TIMEOUT_S = 5.0


class HealthMonitor:
    """One per node. `start()` arms the event set and starts the thread; `stop()` joins it.

    `policy` defaults to the XID policy of `environ` (DP_DISABLE_HEALTHCHECKS...), itself passed in
    by the entry point; none means no variables set, never the process environment."""

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[GpuInfo],
        listener: Listener,
        *,
        settings: HealthSettings | None = None,
        policy: XidPolicy | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait_timeout: float = WAIT_TIMEOUT_S,
        backoff: Backoff | None = None,
    ) -> None:
        self._nvml = nvml
        self._listener = listener
        self._settings = settings or HealthSettings()
        # No process environment read here: the entry point passes `environ` (or the policy) in.
        self._policy = policy or XidPolicy.from_env(environ or {}, self._settings)
        self._clock = clock
        self._wait_ms = max(1, int(wait_timeout * 1000))
        self._rearm_waits = backoff or Backoff(0.1, 5.0)  # after a failed arming: 0.1 s doubling to 5 s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a stop or an update while no event set is armed
        self._thread: threading.Thread | None = None
        self._left: threading.Thread | None = None  # stopped while in real NVML's wait
        self._event_set: EventSet | None = None
        self._next_probe = 0.0
        self._rearm_at = 0.0
        self._unsupported_logged: set[str] = set()
        self._pending_gpus: list[GpuInfo] | None = None
        self._pending_gone: set[str] = set()  # uuids that left an enumeration since the last step
        self._pending_settings: tuple[HealthSettings, XidPolicy] | None = None
        # status, guarded by _lock
        self._degraded_reason: str | None = None
        self._degraded_since: float | None = None  # monitor clock
        self._last_error: str | None = None
        self._rearms = 0
        self._by_xid: Counter[int] = Counter()
        self._by_type: Counter[str] = Counter()
        self._state = HealthState(gpus, self._policy, self._settings.recovery_quiet_period)

    # ---- public ----------------------------------------------------------------------------

    @property
    def policy(self) -> XidPolicy:
        return self._policy

    @property
    def degraded(self) -> bool:
        with self._lock:
            return self._degraded_reason is not None

    def status(self) -> MonitorStatus:
        now = self._clock()
        with self._lock:
            return MonitorStatus(
                failing=self._failing(now),
                running=self._thread is not None and self._thread.is_alive(),
                degraded=self._degraded_reason is not None,
                reason=self._degraded_reason,
                last_error=self._last_error,
                rearms=self._rearms,
                events_by_xid=dict(self._by_xid),
                events_by_type=dict(self._by_type),
            )

    def _failing(self, now: float) -> str | None:
        """Why readiness fails: degraded for longer than the grace period (None otherwise). Under _lock."""
        since, grace = self._degraded_since, self._settings.degraded_grace_period
        if since is None or now - since < grace:
            return None
        return (
            f"health monitor degraded for {format_go_duration(round(now - since, 3))} (over "
            f"health.degradedGracePeriod {format_go_duration(grace)}): {self._degraded_reason}; "
            "device health unchanged"
        )

    def unhealthy(self) -> dict[str, bool]:
        """uuid -> fatal, for every unit the monitor holds Unhealthy."""
        return self._state.unhealthy()

    def faults(self) -> dict[str, HealthChange]:
        """uuid -> what holds it Unhealthy, for every unit the monitor holds Unhealthy."""
        return self._state.faults()

    def start(self) -> None:
        if self._thread is not None:
            return
        if not self._policy.enabled:
            log_event(log, logging.INFO, "health checks disabled", env="DP_DISABLE_HEALTHCHECKS=all")
            return
        log_event(
            log,
            logging.INFO,
            "health monitor starting",
            gpus=len(self._state.gpus),
            probe_interval=self._settings.probe_interval,
            recovery_quiet_period=self._settings.recovery_quiet_period,
            **self._policy.describe(),
        )
        if self._left is not None:  # a restart: the last thread ends its wait first
            self._left.join()
            self._left = None
        self._stop.clear()
        self._emit(self._state.enumeration_faults(self._clock()) + self._try_arm())
        self._thread = threading.Thread(target=self._run, name="nvdp-health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the thread and free the event set. Idempotent. Waits up to `timeout`: a thread still
        in real NVML's wait (which cannot be ended early) frees its event set when the wait ends."""
        self._stop.set()
        self._interrupt()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log_event(log, logging.DEBUG, "health monitor left in its NVML event wait", timeout=timeout)
                self._left = thread
                return
        self._disarm()

    def update_gpus(self, gpus: Sequence[GpuInfo], gone: Iterable[str] = ()) -> None:
        """New enumeration (reload, MIG change): units still present keep their state, except the
        `gone` uuids (they left an enumeration, maybe one this thread never took: start afresh)."""
        with self._lock:
            self._pending_gpus = list(gpus)
            self._pending_gone.update(gone)
        self._interrupt()

    def update_settings(self, settings: HealthSettings, policy: XidPolicy) -> None:
        """New health settings (config reload). Units keep their state: a device already marked stays
        marked (and fatal stays fatal); new events, probes and recoveries follow the new settings.
        The event set is re-armed, since the event types may have changed."""
        with self._lock:
            self._pending_settings = (settings, policy)
        self._interrupt()

    def _interrupt(self) -> None:
        """End the thread's wait: on the event set where NVML can, else at its timeout."""
        self._wake.set()
        event_set = self._event_set
        if event_set is not None:
            event_set.interrupt()

    # ---- thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
        except Exception:  # a bug: say so loudly, leave the devices as they are
            log.exception("health monitor crashed")
            with self._lock:
                self._degraded_reason = "health monitor crashed"
                if self._degraded_since is None:
                    self._degraded_since = self._clock()
        finally:
            self._disarm()

    def _step(self) -> None:
        with self._lock:
            pending, self._pending_gpus = self._pending_gpus, None
            gone, self._pending_gone = self._pending_gone, set()
            new_settings, self._pending_settings = self._pending_settings, None
        if new_settings is not None:
            self._disarm()
            self._settings, self._policy = new_settings
            self._state.set_rules(self._policy, self._settings.recovery_quiet_period)
            self._next_probe = self._rearm_at = 0.0
            log_event(
                log,
                logging.INFO,
                "health settings reloaded",
                probe_interval=self._settings.probe_interval,
                recovery_quiet_period=self._settings.recovery_quiet_period,
                **self._policy.describe(),
            )
        if pending is not None:
            self._disarm()
            self._state.set_gpus(pending, forget=gone)
            self._emit(self._state.enumeration_faults(self._clock()))
            self._next_probe = self._rearm_at = 0.0
        now = self._clock()
        rearming = self._event_set is None and self._policy.events_enabled
        if rearming and now >= self._rearm_at:
            self._emit(self._try_arm())
            rearming = self._event_set is None
        if self._policy.probe and now >= self._next_probe:
            self._emit(self._probe_all(now))
            self._next_probe = now + self._settings.probe_interval
        budget = self._wait_ms / 1000
        if self._policy.probe:
            budget = min(budget, self._next_probe - self._clock())
        if rearming:
            budget = min(budget, self._rearm_at - self._clock())
        if self._event_set is None:
            self._wake.wait(max(budget, 0.001))
            self._wake.clear()
            return
        events, error = self._collect(self._event_set, max(0, int(budget * 1000)))
        self._emit(self._handle_events(events))
        if error is None:
            self._rearm_waits.reset()
            return
        self._disarm()
        self._failed(f"NVML event wait failed: {error}", error)

    def _collect(self, event_set: EventSet, timeout_ms: int) -> tuple[list[NvmlEvent], NvmlError | None]:
        events: list[NvmlEvent] = []
        try:
            event = event_set.wait(timeout_ms)
            while event is not None:
                events.append(event)
                if len(events) >= _MAX_BATCH:
                    break
                event = event_set.wait(0)
        except NvmlError as e:
            return events, e
        return events, None

    # ---- arming ----------------------------------------------------------------------------

    def _try_arm(self) -> list[HealthChange]:
        if not self._policy.events_enabled:
            return []
        try:
            event_set = self._nvml.create_event_set()
        except NvmlError as e:
            self._failed(f"cannot create the NVML event set: {e}", e)
            return []
        wanted = EventType.XID_CRITICAL | EventType.DOUBLE_BIT_ECC
        if self._policy.single_bit_ecc:
            wanted |= EventType.SINGLE_BIT_ECC
        changes: list[HealthChange] = []
        for gpu in self._state.gpus:
            try:
                supported = event_set.register(gpu.uuid, wanted)
            except NvmlNotSupported:
                self._log_unsupported(gpu, EventType(0))
            except GpuLostError:
                changes += self._state.gpu_lost(gpu.uuid, self._clock())
            except NvmlError as e:
                log_event(
                    log,
                    logging.WARNING,
                    "cannot register health events",
                    gpu=gpu.uuid,
                    index=gpu.index,
                    error=str(e),
                )
            else:
                if supported != wanted:
                    self._log_unsupported(gpu, supported)
        self._event_set = event_set
        with self._lock:
            was = self._degraded_reason
            self._degraded_reason = self._degraded_since = None
            if was is not None:
                self._rearms += 1
        if was is not None:
            log_event(log, logging.INFO, "health monitor re-armed", after=was)
        return changes

    def _log_unsupported(self, gpu: GpuInfo, supported: EventType) -> None:
        if gpu.uuid in self._unsupported_logged:
            return
        self._unsupported_logged.add(gpu.uuid)
        log_event(
            log,
            logging.WARNING,
            "GPU does not support all health events",
            gpu=gpu.uuid,
            index=gpu.index,
            supported=str(supported.name or "none").lower(),
        )

    def _disarm(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            try:
                event_set.close()
            except NvmlError as e:
                log_event(log, logging.DEBUG, "closing the NVML event set failed", error=str(e))

    def _failed(self, reason: str, error: NvmlError) -> None:
        """An NVML failure of the monitor itself: degraded, next arming after a backoff."""
        self._rearm_at = self._clock() + self._rearm_waits.next()
        with self._lock:
            first = self._degraded_reason is None
            if first:
                self._degraded_since = self._clock()
            self._degraded_reason = reason
            self._last_error = str(error)
        if first:
            log_event(
                log,
                logging.WARNING,
                "health monitor degraded; device health unchanged",
                reason=reason,
                code=error.code,
            )

    # ---- events and probes -----------------------------------------------------------------

    def _handle_events(self, events: Sequence[NvmlEvent]) -> list[HealthChange]:
        changes: list[HealthChange] = []
        for event in events:
            with self._lock:
                if event.event_type & EventType.XID_CRITICAL:
                    self._by_xid[event.data] += 1
                self._by_type[_type_name(event.event_type)] += 1
            changes += self._state.event(event, self._clock())
        return changes

    def _probe_all(self, now: float) -> list[HealthChange]:
        changes: list[HealthChange] = []
        for gpu in self._state.gpus:
            outcome: ProbeOutcome
            try:
                outcome = self._nvml.probe(gpu.uuid)
            except GpuLostError:
                outcome = GpuLost()
            except NvmlError as e:
                outcome = ProbeFailed(e.code)
            changes += self._state.probed(gpu.uuid, outcome, now)
        return changes

    def _emit(self, changes: list[HealthChange]) -> None:
        if not changes:
            return
        try:
            self._listener(changes)
        except Exception:
            log.exception("health listener failed")


def _type_name(event_type: EventType) -> str:
    if event_type & EventType.XID_CRITICAL:
        return "xid"
    if event_type & EventType.DOUBLE_BIT_ECC:
        return "double-bit-ecc"
    if event_type & EventType.SINGLE_BIT_ECC:
        return "single-bit-ecc"
    return "other"
