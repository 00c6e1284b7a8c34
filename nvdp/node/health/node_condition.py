"""The GPU health condition and taint on this node's Node object, written off the health path.

- `NodeConditionReporter.changed()` only wakes its thread (the monitor never waits on the API); the
  thread also looks every `tick`, works out what the Node should say (`nvdp.node.health.condition`) and
  writes it when that differs from its last write.
- Idempotent: one GET, then a patch of the condition only when the Node differs (lastTransitionTime
  kept while the status stays), of the taints only when nvdp's differ.
- Rate-limited: the next write waits `pacing` (1 s, `nvdp.base.timers`; doubling to 30 s while changing;
  1 s after a quiet minute). Failures (API down, 403, 409) retry on `nvdp.base.backoff`, one WARNING per new
  error.
- A healthy node (clearing an earlier condition) is confirmed only after `settle` seconds, so probes
  speak first and `kubernetes` is not loaded during registration; a fault is written at once.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from nvdp import kube
from nvdp.base.backoff import Backoff
from nvdp.base.logs import log_event
from nvdp.base.timers import TIMERS
from nvdp.kube.client import one_line
from nvdp.node.health.condition import (
    CONDITION_TYPE,
    TAINT_KEY,
    GpuHealthCondition,
    condition_body,
    gpu_health_condition,
    taints_with,
)
from nvdp.node.health.types import HealthChange, HealthSettings, MonitorStatus
from nvdp.node.nvml.types import GpuInfo

log = logging.getLogger(__name__)

SETTLE = TIMERS.node_condition_settle  # 3 s
TICK = 2.0


class NodeStatusClient(Protocol):
    """The Node's conditions and taints (`nvdp.kube.KubeNodeStatus`). Each method raises on failure."""

    def read(self) -> kube.NodeConditionsAndTaints: ...

    def patch_condition(self, condition: Mapping[str, object]) -> None: ...

    def replace_taints(self, taints: Sequence[Mapping[str, object]], resource_version: str) -> None: ...


class NodeStatusRemover(Protocol):
    """The Node's conditions and taints, for `withdraw` (`nvdp.kube.KubeNodeStatus`)."""

    def read(self) -> kube.NodeConditionsAndTaints: ...

    def remove_condition(self, condition_type: str) -> None: ...

    def replace_taints(self, taints: Sequence[Mapping[str, object]], resource_version: str) -> None: ...


class NodeHealthView(Protocol):
    """What the reporter reads of the node's health (`nvdp.node.health.node.NodeHealth`)."""

    @property
    def gpus(self) -> list[GpuInfo]: ...

    @property
    def settings(self) -> HealthSettings: ...

    @property
    def started(self) -> bool: ...

    def faults(self) -> dict[str, HealthChange]: ...

    def monitor_status(self) -> MonitorStatus | None: ...


class NodeConditionReporter:
    """One thread keeping the Node's GPU health condition (and taint) in step with `start`'s view."""

    def __init__(
        self,
        client_factory: Callable[[], NodeStatusClient],
        *,
        settle: float = SETTLE,
        tick: float = TICK,
        pacing: Backoff | None = None,
        retries: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = client_factory
        self._client: NodeStatusClient | None = None
        self._settle, self._tick, self._clock = settle, tick, clock
        self._pacing = pacing or Backoff(TIMERS.node_condition_pacing, 30.0, reset_after=60.0)
        self._retries = retries or Backoff(1.0, 300.0, jitter=0.2)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: GpuHealthCondition | None = None  # what the Node should say, as last worked out
        self._written: tuple[GpuHealthCondition, str | None] | None = None  # (condition, taint effect)
        self._not_before = 0.0  # the pacing after the last write, or the backoff after a failure
        self._error: str | None = None  # the last write's error, said once
        self.syncs = 0  # reads of the Node that led to a write when one was needed (a patch or two)
        self.failures = 0

    def changed(self) -> None:
        """Health changed: look again soon. Never blocks."""
        self._wake.set()

    def start(self, view: NodeHealthView) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(view,), name="nvdp-node-condition", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread (a write under way ends by its own timeout). Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, view: NodeHealthView) -> None:
        settled: float | None = None  # `settle` after the health monitor started
        crashed = False
        while not self._stop.is_set():
            self._wake.clear()  # before the step: a change during it wakes the wait at once
            wait = self._tick
            try:
                if view.started:
                    settled = self._clock() + self._settle if settled is None else settled
                    wait = self._step(view, settled)
            except Exception:  # a bug: said loudly once; the health path is not concerned
                if not crashed:
                    log.exception("node condition reporter failed")
                crashed = True
            self._wake.wait(max(wait, 0.0))

    def _step(self, view: NodeHealthView, settled: float) -> float:
        """Write what the Node should say when that is due; the seconds until it is due (or `tick`)."""
        status = view.monitor_status()
        effect = view.settings.taint_on_fatal
        self._said = said = gpu_health_condition(
            view.gpus,
            view.faults(),
            monitor_failing=status.failing if status is not None else None,
            before=self._said,
            taint=effect is not None,
        )
        if self._written == (said, effect):
            return self._tick
        now = self._clock()
        due = self._not_before
        if self._written is None and said.status == "True":
            due = max(due, settled)  # a healthy start: let the first probes speak first
        if now < due:
            return due - now
        try:
            self._write(said, effect)
        except Exception as error:  # the API server's problems are never ours to raise
            self._failed(error)
            return self._not_before - now
        self._written = (said, effect)
        self._retries.reset()
        self._not_before = self._clock() + self._pacing.next()
        return self._tick

    def _write(self, said: GpuHealthCondition, effect: str | None) -> None:
        if self._client is None:
            self._client = self._factory()
        node = self._client.read()
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.syncs += 1
        taints = taints_with(node.taints, said.taint, effect, now)  # first: a condition's patch moves
        # the resourceVersion on, and the taints are replaced at the one read (else a 409, a retry)
        if taints is not None:
            self._client.replace_taints(taints, node.resource_version)
            if said.taint is not None and effect is not None:
                log_event(log, logging.WARNING, "node tainted", taint=f"{TAINT_KEY}={said.taint}:{effect}")
            else:
                log_event(log, logging.INFO, "node taint removed", taint=TAINT_KEY)
        condition = condition_body(said, node.condition(CONDITION_TYPE), now)
        if condition is not None:
            self._client.patch_condition(condition)
            log_event(
                log,
                logging.WARNING if said.status == "False" else logging.INFO,
                "node condition set",
                condition=CONDITION_TYPE,
                status=said.status,
                reason=said.reason,
                detail=said.message,
            )
        if self._error is not None:
            log_event(log, logging.INFO, "node condition written again", failures=self.failures)
            self._error = None

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        wait = self._retries.next()
        self._not_before = self._clock() + wait
        text = one_line(error)
        if text != self._error:
            log_event(
                log,
                logging.WARNING,
                "node condition not written; retrying",
                error=text,
                retry_in=round(wait, 1),
            )
        self._error = text


def withdraw(client: NodeStatusRemover) -> None:
    """The release is uninstalled: nvdp's condition and taint leave the Node (nothing writes them any
    more, and a condition with no writer misleads). One GET, then a patch for each that is there
    (no retry: the pod is stopping); a failure is one WARNING line (what stays is said)."""
    try:
        node = client.read()
        taints = taints_with(node.taints, None, None, "")
        if taints is not None:  # first: the condition's patch moves the resourceVersion on
            client.replace_taints(taints, node.resource_version)
            log_event(log, logging.INFO, "node taint removed", taint=TAINT_KEY)
        if node.condition(CONDITION_TYPE) is not None:
            client.remove_condition(CONDITION_TYPE)
            log_event(log, logging.INFO, "node condition removed", condition=CONDITION_TYPE)
    except Exception as error:  # the API server's problems: said, never raised at stop
        log_event(
            log,
            logging.WARNING,
            "node condition not removed at uninstall; remove it by hand",
            condition=CONDITION_TYPE,
            taint=TAINT_KEY,
            error=one_line(error),
        )


def node_condition_from_env(
    environ: Mapping[str, str],
    *,
    node: str,
    kubeconfig: str = "",
    token_file: str = kube.SERVICE_ACCOUNT_TOKEN,
) -> NodeConditionReporter | None:
    """A reporter for the Node `node` when the API server is reachable: through `kubeconfig` when
    given, else with in-cluster credentials; None otherwise (no node name, or no credentials). The
    `kubernetes` client is built (and ssl let in) with the first write."""
    if not node:
        return None
    if not kubeconfig and not kube.in_cluster(environ, token_file):
        return None
    return NodeConditionReporter(
        lambda: kube.KubeNodeStatus(
            node, api_client=kube.new_api_client(kubeconfig=kubeconfig or None, retries=0)
        )
    )
