"""Events on the pods a health transition hits: each pod holding a device of the GPU (or MIG device)
that went Unhealthy gets a Warning event of its own (GPUUnhealthy), and a Normal one (GPUHealthy)
when it recovers, for `kubectl describe pod` to show: which GPU, the XID and its meaning, since when,
and whether nvdp expects the GPU back.

Like Node events (`nvdp.health.node_events`) they are posted off the health path: `record()` only
queues (a full queue drops, with a warning) and one worker thread posts. Each pod's events about one
GPU are bounded (`nvdp.health.event_budget`): a flapping GPU posts a few, not one per flap.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nvdp import kube
from nvdp.devices import Device
from nvdp.health.event_budget import EventBudget
from nvdp.health.types import HealthChange
from nvdp.logs import log_event
from nvdp.units import format_go_duration

if TYPE_CHECKING:
    from nvdp.ledger.types import Holding

log = logging.getLogger(__name__)

UNHEALTHY_REASON = "GPUUnhealthy"
HEALTHY_REASON = "GPUHealthy"


class PodEventClient(Protocol):
    def create_pod_event(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        container: str,
        event_type: str,
        reason: str,
        message: str,
    ) -> None:
        """Create one Event on the pod. Raises on failure."""
        ...


@dataclass(frozen=True)
class PodEvent:
    """One event for one pod (`container`: the one holding the devices, "" when several do)."""

    namespace: str
    name: str
    uid: str | None
    container: str
    event_type: str
    reason: str
    message: str


def pod_events(
    resource: str,
    devices: Sequence[Device],
    change: HealthChange,
    before: HealthChange | None,
    holders: Sequence[Holding],
    *,
    recovery_quiet_period: float,
    now: float,
) -> list[PodEvent]:
    """One event per pod among `holders` of `devices` (the devices of `resource` on the unit that
    changed), in the order the pods first appear (pure)."""
    by_pod: dict[tuple[str, str, str | None], list[Holding]] = {}
    for holding in holders:
        by_pod.setdefault((holding.namespace, holding.pod, holding.uid), []).append(holding)
    unit = _unit(devices[0])
    since = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if change.healthy:
        event_type, reason = "Normal", HEALTHY_REASON
        after = f", after {format_go_duration(round(change.since - before.since))}" if before else ""
        was = f" unhealthy ({_cause(before)})" if before else ""
        state = f"is healthy again since {since}{after}{was}."
        outlook = ""
    else:
        event_type, reason = "Warning", UNHEALTHY_REASON
        state = f"is unhealthy since {since}: {_cause(change)}."
        outlook = " " + _outlook(change, recovery_quiet_period)
    events = []
    for (namespace, name, uid), held in by_pod.items():
        containers = [c for c in dict.fromkeys(h.container for h in held) if c]
        ids = ", ".join(dict.fromkeys(h.device_id for h in held))
        claims = ", ".join(dict.fromkeys(h.claim for h in held if h.claim))
        through = f" through ResourceClaim {claims}" if claims else ""
        where = f" (container {', '.join(containers)})" if containers else ""
        holds = f" This pod holds {resource} {ids} on it{through}{where}."
        message = f"{unit} {state}{holds}{outlook}"
        container = containers[0] if len(containers) == 1 else ""
        events.append(PodEvent(namespace, name, uid, container, event_type, reason, message))
    return events


def _unit(device: Device) -> str:
    gpu = f"GPU {device.gpu_index} ({device.gpu_uuid})"
    return f"MIG device {device.index} ({device.uuid}) on {gpu}" if device.is_mig else gpu


def _cause(change: HealthChange) -> str:
    return f"XID {change.xid}, {change.reason}" if change.xid is not None else change.reason


def _outlook(change: HealthChange, recovery_quiet_period: float) -> str:
    if change.fatal:
        return (
            "nvdp does not expect it to recover: it stays Unhealthy until the GPU is reset and the "
            "device plugin restarted."
        )
    if recovery_quiet_period <= 0:
        return (
            "Recovery is off (health.recoveryQuietPeriod 0): it stays Unhealthy until the device plugin "
            "restarts."
        )
    return (
        f"nvdp expects it to recover: Healthy again once {format_go_duration(recovery_quiet_period)} pass "
        "without a new error and a probe of the GPU passes."
    )


class PodEventRecorder:
    """Bounded queue + one worker thread posting pod events with `client_factory()`'s client (built
    with the first event). `recovery_quiet_period` is read when a fault is recorded, for the outlook
    its events give."""

    def __init__(
        self,
        client_factory: Callable[[], PodEventClient],
        *,
        recovery_quiet_period: Callable[[], float],
        budget: EventBudget | None = None,
        max_queue: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._factory = client_factory
        self._client: PodEventClient | None = None
        self._quiet = recovery_quiet_period
        self._budget = budget or EventBudget()
        self._clock = clock
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(max_queue)
        self._closed = False
        self._abandoned = False
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="nvdp-pod-events", daemon=True)
        self._thread.start()

    def record(
        self,
        resource: str,
        devices: Sequence[Device],
        change: HealthChange,
        before: HealthChange | None,
        holders: Sequence[Holding],
    ) -> None:
        """Queue the events of the pods `holders` names; never blocks."""
        if self._closed or not holders or not devices:
            return
        events = pod_events(
            resource, devices, change, before, holders, recovery_quiet_period=self._quiet(), now=self._clock()
        )
        for event in events:
            pod = f"{event.namespace}/{event.name}"
            if not self._budget.allow(
                ("pod", pod, event.uid, change.uuid), f"pod {pod} device {change.uuid}"
            ):
                continue
            try:
                self._queue.put_nowait(event)
            except queue.Full:
                with self._lock:
                    self.dropped += 1
                log_event(log, logging.WARNING, "pod event dropped: queue full", pod=pod, reason=event.reason)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued within `timeout`, then stop (what is left is dropped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._abandoned = True

    def join(self, timeout: float) -> bool:
        """Wait until every queued event was handled (tests, shutdown); True when done."""
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None or self._abandoned:
                    return
                self._send(event)
            finally:
                self._queue.task_done()

    def _send(self, event: PodEvent) -> None:
        try:
            if self._client is None:
                self._client = self._factory()
            self._client.create_pod_event(
                event.namespace,
                event.name,
                event.uid,
                event.container,
                event.event_type,
                event.reason,
                event.message,
            )
        except Exception as error:  # the API server's problems are never ours to raise
            with self._lock:
                self.failed += 1
            log_event(
                log,
                logging.WARNING,
                "pod event not recorded",
                pod=f"{event.namespace}/{event.name}",
                reason=event.reason,
                error=" ".join(str(error).split())[:300] or type(error).__name__,
            )
        else:
            with self._lock:
                self.sent += 1


def pod_events_from_env(
    environ: Mapping[str, str],
    *,
    recovery_quiet_period: Callable[[], float],
    node: str | None = None,
    kubeconfig: str = "",
    token_file: str = kube.SERVICE_ACCOUNT_TOKEN,
) -> PodEventRecorder | None:
    """A recorder of pod events, posted by this node's plugin (`node`, else NODE_NAME), when the API
    server is reachable: through `kubeconfig` when given, else with in-cluster credentials; None
    otherwise (as `nvdp.health.node_events.node_events_from_env` decides for Node events). The
    `kubernetes` client is built (and ssl let in) only when the first event is sent."""
    name = environ.get("NODE_NAME", "") if node is None else node
    if not name:
        return None
    if kubeconfig:
        return PodEventRecorder(
            lambda: kube.KubePodEvents(name, api_client=kube.new_api_client(kubeconfig=kubeconfig)),
            recovery_quiet_period=recovery_quiet_period,
        )
    if not kube.in_cluster(environ, token_file):
        return None
    return PodEventRecorder(lambda: kube.KubePodEvents(name), recovery_quiet_period=recovery_quiet_period)
