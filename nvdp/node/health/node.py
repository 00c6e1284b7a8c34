"""The node's health: one NVML health monitor per node feeding one router to the plugin servers.

This is what the supervisor starts, re-targets on reloads and stops (its `HealthHooks`), and what
metrics and /readyz read. Kubernetes Node events, the allocation ledger (to name the pods a transition
hits) and the pods' events are optional parts handed in by the wiring, and so is an observer told of
every change (the Node condition's reporter, which reads the faults here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from nvdp.node.health.monitor import HealthMonitor
from nvdp.node.health.router import AllocationLookup, HealthRouter, NodeEventSink, PodEventSink
from nvdp.node.health.types import HealthChange, HealthSettings, HealthTarget, MonitorStatus
from nvdp.node.health.xid import XidPolicy
from nvdp.node.nvml.types import GpuInfo, Nvml


class NodeHealth:
    """One health monitor per node feeding one router.

    `node_events` is where health transitions go as Node events when health checks are on (None: no
    Node events); `allocations` names the pods holding a device that changed (None: none named) and
    `pod_events` gives those pods an event each (None: no pod events). Their owner closes them.
    `on_change` is called after each batch of changes (on the monitor's thread) and after each start;
    it must not block.
    """

    def __init__(
        self,
        nvml: Nvml,
        settings: HealthSettings,
        environ: Mapping[str, str],
        node_events: NodeEventSink | None = None,
        *,
        allocations: AllocationLookup | None = None,
        pod_events: PodEventSink | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._settings = settings
        self._environ = environ
        self._gpus: list[GpuInfo] = []
        self.policy = XidPolicy.from_env(environ, settings)
        enabled = self.policy.enabled
        self.router = HealthRouter(
            node_events=node_events if enabled else None,
            allocations=allocations,
            pod_events=pod_events if enabled else None,
        )
        self.monitor: HealthMonitor | None = None
        self._on_change = on_change

    def start(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None) -> None:
        if settings is not None and settings != self._settings:
            self._settings = settings
            self.policy = XidPolicy.from_env(self._environ, settings)
            if self.monitor is not None:
                self.monitor.update_settings(settings, self.policy)
        gone = _uuids(self._gpus) - _uuids(gpus)
        if gone:  # a device that comes back is a new one: it starts Healthy
            self.router.forget(gone)
        if self.monitor is None:
            self.monitor = HealthMonitor(
                self._nvml, gpus, self._changed, settings=self._settings, policy=self.policy
            )
            self.monitor.start()
        elif list(gpus) != self._gpus:
            # Only a changed enumeration re-arms the event set: freeing it drops queued events.
            self.monitor.update_gpus(gpus, gone)
        self._gpus = list(gpus)
        if self._on_change is not None:
            self._on_change()

    def _changed(self, changes: Sequence[HealthChange]) -> None:
        """The monitor's listener: the router, then the observer."""
        self.router(changes)
        if self._on_change is not None:
            self._on_change()

    def set_targets(self, targets: Sequence[HealthTarget]) -> None:
        self.router.set_targets(targets)

    @property
    def recovery_quiet_period(self) -> float:
        """Seconds without a new error after which a non-fatal fault recovers (0: never)."""
        return self._settings.recovery_quiet_period

    # ---- read by metrics and /readyz (nvdp.plugins.metrics.HealthView) ----
    @property
    def checks_enabled(self) -> bool:
        return self.policy.enabled

    def monitor_status(self) -> MonitorStatus | None:
        return self.monitor.status() if self.monitor is not None else None

    def unhealthy(self) -> dict[str, HealthChange]:
        return self.router.unhealthy()

    # ---- read by the Node condition's reporter (nvdp.node.health.node_condition.NodeHealthView) ----
    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    @property
    def settings(self) -> HealthSettings:
        return self._settings

    @property
    def started(self) -> bool:
        return self.monitor is not None

    def faults(self) -> dict[str, HealthChange]:
        """What the monitor holds against each Unhealthy unit (a fatal cause after a marking included)."""
        return self.monitor.faults() if self.monitor is not None else {}

    def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()


def _uuids(gpus: Sequence[GpuInfo]) -> set[str]:
    """The GPU and MIG uuids of an enumeration."""
    return {g.uuid for g in gpus} | {m.uuid for g in gpus for m in g.mig_devices}
