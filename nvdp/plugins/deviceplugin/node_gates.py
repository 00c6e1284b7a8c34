"""The node facts between the resources a config makes of the node and what the supervisor serves:
four gates that withhold devices, each fixable under a running plugin.

- `own_gpus`: the GPUs the DRA driver serves (`dra.devices`, `nvdp.plugins.handoff`), applied before the
  resources are built; MPS readiness (`nvdp.node.mps.ready`); the device nodes Allocate names
  (`nvdp.plugins.deviceplugin.device_nodes`); the CDI specs on disk (`nvdp.node.cdi.publisher`).
- Each reports misfits under its own source (`handoff`, `mps`, `device-nodes`, `cdi`).
- `changed()` keeps their directories in the supervisor's inotify watch and says when to apply
  again; `retry_in()` is the CDI retry's and hand-over's timer, None while all is well.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from nvdp.base.dir_watch import Watcher
from nvdp.base.logs import log_event
from nvdp.config.model import MPS
from nvdp.node.gpus.inventory import dra_gpus
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import NodeResources, Resource
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.device_nodes import DeviceNodes
from nvdp.plugins.deviceplugin.types import DaemonSettings, MisfitSink
from nvdp.plugins.handoff import Handoff

if TYPE_CHECKING:
    from nvdp.node.cdi.publisher import CdiPublisher
    from nvdp.node.mps.ready import MpsReadiness

log = logging.getLogger(__name__)


# GPU uuid -> the pod holding it (None: not known yet); read afresh when asked (a GPU is withdrawn)
HoldsSource = Callable[[Sequence[GpuInfo], bool], Mapping[str, str] | None]


class NodeGates:
    """`handoff` and `holds` (GPU uuid -> the pod holding it through this plugin) take part in the
    hand-over with the DRA driver; without a `handoff` only the config decides."""

    def __init__(
        self, misfits: MisfitSink | None, handoff: Handoff | None = None, holds: HoldsSource | None = None
    ) -> None:
        self._misfits = misfits
        self._handoff = handoff
        self._holds = holds
        self._mine: frozenset[str] = frozenset()  # the GPUs the config gives this plugin
        self._settled: frozenset[str] = frozenset()  # those the hand-over lets it serve
        self._all_dra = False
        self._mps: MpsReadiness | None = None  # MPS resources only while their control daemon is
        # ready (made by the first build with an MPS resource: a plugin without one never imports it)
        self._device_nodes = DeviceNodes()  # devices only while the nodes answers name exist
        self._cdi: CdiPublisher | None = None  # made by the first CDI apply (a plugin without CDI
        # never imports the spec builder)
        self._nothing_said = False

    def own_gpus(self, settings: DaemonSettings, gpus: Sequence[GpuInfo]) -> list[GpuInfo]:
        """The GPUs this plugin serves: those the config does not give the DRA driver, as the hand-over
        allows (a GPU DRA still serves or holds waits; one a pod holds here stays until released)."""
        dra, misfits = dra_gpus(settings.rules.dra_devices, gpus)
        mine = frozenset(g.uuid for g in gpus) - dra
        withdrawing = bool(self._settled - mine)  # only a fresh record may let a GPU go
        self._mine = self._settled = mine
        self._all_dra = bool(gpus) and not mine
        if self._handoff is not None:
            holds = self._holds(gpus, withdrawing) if self._holds is not None else {}
            self._settled = self._handoff.settle(mine, holds, gpus).serve
            misfits += self._handoff.misfits({g.uuid: f"GPU {g.index}" for g in gpus})
        self.report("handoff", misfits)
        return [g for g in gpus if g.uuid in self._settled]

    def served(self, resources: Sequence[Resource]) -> None:
        """The servers advertise `resources`, of the GPUs `own_gpus` allowed (and no GPU it left out):
        the record says so, with how many devices each resource lists."""
        if self._handoff is not None:
            self._handoff.served(self._settled, {r.name: len(r.devices) for r in resources})

    def admit(self, settings: DaemonSettings, resources: Sequence[Resource]) -> NodeResources:
        """`resources` without an MPS resource whose daemon is not ready and without the devices
        whose nodes are missing, with the misfits that say so (reported)."""
        if self._mps is None and any(r.sharing == MPS for r in resources):
            from nvdp.node.mps.ready import MpsReadiness

            self._mps = MpsReadiness()
        mps = NodeResources(list(resources))
        if self._mps is not None:
            mps = self._mps.filter(resources, settings.response.mps_root)
        self.report("mps", mps.misfits)
        checked = self._device_nodes.check(mps.resources, settings)
        self.report("device-nodes", checked.misfits)
        return NodeResources(checked.resources, (*mps.misfits, *checked.misfits))

    def publish(
        self,
        settings: DaemonSettings,
        gpus: Sequence[GpuInfo],
        resources: list[Resource],
        driver_version: Callable[[], str],
    ) -> tuple[list[Resource], tuple[str, ...], tuple[Misfit, ...]]:
        """With a CDI strategy: the specs on disk, and only what resolves in them (misfits reported),
        with the CDI names every answer adds."""
        if settings.cdi is None:
            self.close()
            self.report("cdi", ())
            return resources, (), ()
        if self._cdi is None:
            from nvdp.node.cdi.publisher import CdiPublisher

            self._cdi = CdiPublisher()
        cdi = self._cdi.publish(settings.cdi, gpus, resources, driver_version())
        self.report("cdi", cdi.misfits)
        return cdi.resources, cdi.extra_names, cdi.misfits

    def changed(self, watcher: Watcher) -> bool:
        """Watch what the gates depend on; whether any of it changed (each is asked, so each keeps
        its watch up to date): the DRA driver's hand-over record or its retry, an MPS ready marker, a
        device node, the CDI specs or their retry."""
        if self._handoff is not None:
            self._handoff.watch(watcher)
        changes = [
            self._handoff is not None and self._handoff.due(),
            self._mps is not None and self._mps.changed(watcher),
            self._device_nodes.changed(watcher),
            self._cdi is not None and self._cdi.changed(watcher),
        ]
        return any(changes)

    def retry_in(self) -> float | None:
        delays = [
            self._cdi.retry_in() if self._cdi is not None else None,
            self._handoff.retry_in() if self._handoff is not None else None,
        ]
        return min((d for d in delays if d is not None), default=None)

    def close(self) -> None:
        """The specs stay for running containers; the spec directory's lock goes."""
        if self._cdi is not None:
            self._cdi.close()

    def stop(self) -> None:
        """The plugin stops (its servers stopped): the CDI lock goes; the hand-over record says this
        plugin serves nothing and holds what its pods hold, and its lock goes."""
        self.close()
        if self._handoff is not None:
            self._handoff.served(frozenset(), {})
            self._handoff.close()

    def report(self, source: str, misfits: tuple[Misfit, ...]) -> None:
        if self._misfits is not None:
            self._misfits.update(source, misfits)

    def say_nothing_served(self, nothing: bool, gpus: int, misfits: tuple[Misfit, ...]) -> None:
        """Say once (until something is served again) that nothing is served, and why."""
        if nothing and not self._nothing_said:
            if self._all_dra:
                log_event(
                    log,
                    logging.INFO,
                    "every GPU is the DRA driver's (dra.devices); the device plugin serves none",
                    gpus=gpus,
                )
            elif not gpus:
                log_event(
                    log, logging.WARNING, "no devices found on this node; waiting (send SIGHUP to rescan)"
                )
            else:
                log_event(
                    log,
                    logging.WARNING,
                    "nothing served although GPUs were found; the warnings above say why",
                    gpus=gpus,
                    reasons=",".join(sorted({m.reason for m in misfits})) or None,
                )
        self._nothing_said = nothing
