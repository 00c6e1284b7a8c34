"""The node facts between the resources a config makes of the node and what the supervisor serves.

Three gates, each a fact that can withhold devices and that the node can fix under a running plugin:
the MPS control daemon's readiness (`nvdp.mps.ready`), the device nodes that Allocate answers name
(`nvdp.plugin.device_nodes`) and the CDI specs on disk (`nvdp.cdi.publisher`). Each reports its
misfits under its own source (`mps`, `device-nodes`, `cdi`); `changed()` keeps their directories in
the supervisor's inotify watch and says when to apply again; `retry_in()` is the CDI retry's timer,
None while all is well.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nvdp.dir_watch import Watcher
from nvdp.logs import log_event
from nvdp.misfits import Misfit
from nvdp.mps.ready import MpsReadiness
from nvdp.nvml.types import GpuInfo
from nvdp.plugin.device_nodes import DeviceNodes
from nvdp.plugin.types import DaemonSettings, MisfitSink
from nvdp.resources import NodeResources, Resource

if TYPE_CHECKING:
    from nvdp.cdi.publisher import CdiPublisher

log = logging.getLogger(__name__)


class NodeGates:
    def __init__(self, misfits: MisfitSink | None) -> None:
        self._misfits = misfits
        self._mps = MpsReadiness()  # MPS resources only while their control daemon is ready
        self._device_nodes = DeviceNodes()  # devices only while the nodes answers name exist
        self._cdi: CdiPublisher | None = None  # made by the first CDI apply (a plugin without CDI
        # never imports the spec builder)
        self._nothing_said = False

    def admit(self, settings: DaemonSettings, resources: Sequence[Resource]) -> NodeResources:
        """`resources` without an MPS resource whose daemon is not ready and without the devices
        whose nodes are missing, with the misfits that say so (reported)."""
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
            from nvdp.cdi.publisher import CdiPublisher

            self._cdi = CdiPublisher()
        cdi = self._cdi.publish(settings.cdi, gpus, resources, driver_version())
        self.report("cdi", cdi.misfits)
        return cdi.resources, cdi.extra_names, cdi.misfits

    def changed(self, watcher: Watcher) -> bool:
        """Watch what the gates depend on; whether any of it changed (each is asked, so each keeps
        its watch up to date): an MPS ready marker, a device node, the CDI specs or their retry."""
        changes = [
            self._mps.changed(watcher),
            self._device_nodes.changed(watcher),
            self._cdi is not None and self._cdi.changed(watcher),
        ]
        return any(changes)

    def retry_in(self) -> float | None:
        return self._cdi.retry_in() if self._cdi is not None else None

    def close(self) -> None:
        """The specs stay for running containers; the spec directory's lock goes."""
        if self._cdi is not None:
            self._cdi.close()

    def report(self, source: str, misfits: tuple[Misfit, ...]) -> None:
        if self._misfits is not None:
            self._misfits.update(source, misfits)

    def say_nothing_served(self, nothing: bool, gpus: int, misfits: tuple[Misfit, ...]) -> None:
        """Say once (until something is served again) that nothing is served, and why."""
        if nothing and not self._nothing_said:
            if not gpus:
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
