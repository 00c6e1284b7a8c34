"""Events on the pods a health transition hits: each pod holding a device of the GPU (or MIG device)
that went Unhealthy gets a Warning event of its own (GPUUnhealthy), and a Normal one (GPUHealthy)
when it recovers, for `kubectl describe pod` to show: which GPU, the XID and its meaning, since when,
and whether nvdp expects the GPU back.

Like Node events they are posted off the health path (`nvdp.node.health.event_sender`). Each pod's events
about one GPU are bounded (`nvdp.node.health.event_budget`): a flapping GPU posts a few, not one per flap.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from nvdp import kube
from nvdp.base.units import format_go_duration
from nvdp.kube import Involved
from nvdp.node.gpus.devices import Device
from nvdp.node.health.event_budget import EventBudget
from nvdp.node.health.event_sender import Event, EventClient, EventSender, writer_from_env
from nvdp.node.health.types import HealthChange

if TYPE_CHECKING:
    from nvdp.plugins.ledger.types import Holding

log = logging.getLogger(__name__)

UNHEALTHY_REASON = "GPUUnhealthy"
HEALTHY_REASON = "GPUHealthy"


def pod_events(
    resource: str,
    devices: Sequence[Device],
    change: HealthChange,
    before: HealthChange | None,
    holders: Sequence[Holding],
    *,
    recovery_quiet_period: float,
    now: float,
) -> list[Event]:
    """One event per pod among `holders` of `devices` (the devices of `resource` on the unit that
    changed), in the order the pods first appear (pure); on the pod's container holding the devices,
    on no container when several do."""
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
        events.append(Event(Involved.pod(namespace, name, uid, container), event_type, reason, message))
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


class PodEventRecorder(EventSender):
    """Events on the pods a health transition hits, posted with `client_factory()`'s client (built
    with the first event). `recovery_quiet_period` is read when a fault is recorded, for the outlook
    its events give."""

    def __init__(
        self,
        client_factory: Callable[[], EventClient],
        *,
        recovery_quiet_period: Callable[[], float],
        budget: EventBudget | None = None,
        max_queue: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(client_factory, kind="pod", max_queue=max_queue, log=log)
        self._quiet = recovery_quiet_period
        self._budget = budget or EventBudget()
        self._clock = clock

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
            pod = f"{event.about.namespace}/{event.about.name}"
            if self._budget.allow(
                ("pod", pod, event.about.uid, change.uuid), f"pod {pod} device {change.uuid}"
            ):
                self.send(event)


def pod_events_from_env(
    environ: Mapping[str, str],
    *,
    recovery_quiet_period: Callable[[], float],
    node: str | None = None,
    kubeconfig: str = "",
    token_file: str = kube.SERVICE_ACCOUNT_TOKEN,
) -> PodEventRecorder | None:
    """A recorder of pod events, posted by this node's plugin (`node`, else NODE_NAME), when the API
    server is reachable (`nvdp.node.health.event_sender.writer_from_env`); None otherwise."""
    found = writer_from_env(
        environ, node=node, kubeconfig=kubeconfig, component=kube.EVENT_SOURCE, token_file=token_file
    )
    if found is None:
        return None
    return PodEventRecorder(found[1], recovery_quiet_period=recovery_quiet_period)
