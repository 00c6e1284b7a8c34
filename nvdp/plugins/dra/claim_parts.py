"""The DRA plugin's parts about its prepared claims, built together and handed to the preparer as one.

- `sharing`: claims' sharing configs applied and undone (`nvdp.plugins.dra.claim_sharing`); `holders`: the
  pods each claim is reserved for, and the allocations file (`nvdp.plugins.dra.holders`).
- `health`: the node's health, whose transitions name those claims and pods (log line, Node event).
- `node_events`, `pod_events`: the Events it posts (one per holding pod), when the API is reachable.
- The preparer calls `touch` / `apply` at prepare, `unprepared` at unprepare (`release` where a
  claim is not prepared after all); `NO_CLAIMS` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nvdp.node.health.node import NodeHealth
from nvdp.node.health.node_events import NodeEventRecorder, node_events_from_env
from nvdp.node.health.pod_events import PodEventRecorder, pod_events_from_env
from nvdp.node.health.settings import health_settings
from nvdp.node.nvml.types import Nvml
from nvdp.plugins.dra.allocations import ALLOCATIONS_FILE
from nvdp.plugins.dra.checkpoint import PreparedClaim
from nvdp.plugins.dra.claim_sharing import ClaimSharing, node_sharing
from nvdp.plugins.dra.claims import Allocated, ClaimRef
from nvdp.plugins.dra.cluster import ResourceApi
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.holders import ClaimHolders
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.options import DraSettings
from nvdp.plugins.dra.sharing import OpaqueConfig

if TYPE_CHECKING:
    from nvdp.plugins.dra.prepare import ClaimPreparer


class ClaimHooks(Protocol):
    """What the preparer calls (`ClaimParts`, `NO_CLAIMS`)."""

    def touch(self, refs: Iterable[ClaimRef]) -> None: ...
    def apply(
        self,
        ref: ClaimRef,
        configs: Sequence[OpaqueConfig],
        allocated: Sequence[Allocated],
        devices: Mapping[str, DraDevice],
        edits: dict[str, dict[str, list[Any]]],
    ) -> None: ...
    def release(self, uid: str) -> None: ...
    def unprepared(self, uids: Sequence[str]) -> None: ...


class _NoClaims:
    def touch(self, refs: Iterable[ClaimRef]) -> None:
        pass

    def apply(self, *args: Any) -> None:
        pass

    def release(self, uid: str) -> None:
        pass

    def unprepared(self, uids: Sequence[str]) -> None:
        pass


NO_CLAIMS: ClaimHooks = _NoClaims()


class DriverParts(Protocol):
    """What of the driver the parts read: NVML, the API, the node's state and the preparer (built
    after the parts, at the driver's start)."""

    nvml: Nvml
    api: ResourceApi
    state: NodeState

    @property
    def preparer(self) -> ClaimPreparer | None: ...


@dataclass
class ClaimParts:
    sharing: ClaimSharing
    holders: ClaimHolders
    health: NodeHealth
    node_events: NodeEventRecorder | None
    pod_events: PodEventRecorder | None
    prepared: Callable[[], Mapping[str, PreparedClaim] | None]  # by UID; None before the preparer
    resumed: bool = False

    @classmethod
    def of(cls, driver: DriverParts, settings: DraSettings, environ: Mapping[str, str]) -> ClaimParts:
        node, kubeconfig = settings.node_name, settings.kubeconfig
        sharing = node_sharing(settings, driver.nvml, environ)

        def prepared() -> dict[str, PreparedClaim] | None:
            preparer = driver.preparer
            return dict(preparer.prepared) if preparer is not None else None

        file = settings.plugin_dir / ALLOCATIONS_FILE
        holders = ClaimHolders(driver.api, lambda: prepared() or {}, driver.state, sharing.shares, file)
        node_events = node_events_from_env(environ, node=node, kubeconfig=kubeconfig)
        pod_events = pod_events_from_env(
            environ,
            node=node,
            kubeconfig=kubeconfig,
            recovery_quiet_period=lambda: health.recovery_quiet_period,
        )
        health = NodeHealth(
            driver.nvml,
            health_settings(settings.config),
            environ,
            node_events=node_events,
            allocations=holders,
            pod_events=pod_events,
        )
        return cls(sharing, holders, health, node_events, pod_events, prepared)

    # ---- the preparer's calls -----------------------------------------------------------------------
    def touch(self, refs: Iterable[ClaimRef]) -> None:
        self.holders.touch(refs)

    def apply(
        self,
        ref: ClaimRef,
        configs: Sequence[OpaqueConfig],
        allocated: Sequence[Allocated],
        devices: Mapping[str, DraDevice],
        edits: dict[str, dict[str, list[Any]]],
    ) -> None:
        """The claim's sharing configs applied to `devices` (as made: a dynamic-MIG placement's MIG
        device); their CDI edits added to `edits` (device name -> containerEdits lists)."""
        for name, more in self.sharing.apply(ref, configs, allocated, devices).items():
            for key, values in more.items():
                edits.setdefault(name, {})[key] = [*edits.get(name, {}).get(key, []), *values]

    def release(self, uid: str) -> None:
        self.sharing.release(uid)

    def unprepared(self, uids: Sequence[str]) -> None:
        for uid in uids:
            self.sharing.release(uid)
        self.holders.forget(uids)

    def publish(self) -> None:
        """After each health push (NVML up): the allocations file written if it changed; the first
        time, the MPS daemons of the claims prepared before a restart started again."""
        prepared = self.prepared()
        if not self.resumed and prepared is not None:
            self.resumed = True
            self.sharing.mps.resume(prepared)
        self.holders.publish()

    def close(self) -> None:
        """The MPS daemons and the reads stopped, the allocations file removed, the Events sent."""
        self.sharing.mps.stop()
        self.holders.close()
        for events in (self.node_events, self.pod_events):
            if events is not None:
                events.close()
