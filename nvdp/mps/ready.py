"""The plugin's side of MPS readiness: an MPS resource is served only while its control daemon's
ready marker `<root>/<resource>/.started` exists.

The supervisor filters the resources it builds through `MpsReadiness.filter` and, on every wake-up
of its directory watcher, asks `changed()`: the marker directories (or their nearest existing
parent, before the daemon has created them) are added to the same inotify watch, so a marker that
appears or goes wakes the supervisor at once; there is no polling loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from nvdp.logs import log_event
from nvdp.nvml.types import GpuInfo
from nvdp.resources import Resource

from .layout import MpsRoot
from .plan import MPS_STRATEGY, check_node

log = logging.getLogger(__name__)


class Watcher(Protocol):
    def add(self, directory: Path) -> bool: ...


class MpsReadiness:
    def __init__(self) -> None:
        self._root: MpsRoot | None = None
        self._names: tuple[str, ...] = ()  # the MPS resources of the last build
        self._ready: frozenset[str] = frozenset()  # those of them with a marker then

    def filter(
        self, resources: Sequence[Resource], gpus: Sequence[GpuInfo], root: str | None
    ) -> list[Resource]:
        """The resources to serve now: MPS ones only while their marker exists. Raises
        ResourceError for what MPS refuses on this node (MIG devices, too many clients)."""
        check_node(resources, gpus)
        self._names = tuple(r.name for r in resources if r.sharing == MPS_STRATEGY)
        self._root = MpsRoot(Path(root)) if root else None
        self._ready = self._present()
        for name in self._names:
            if name not in self._ready and self._root is not None:
                log_event(
                    log,
                    logging.INFO,
                    "waiting for the MPS control daemon",
                    resource=name,
                    marker=str(self._root.marker(name)),
                )
        return [r for r in resources if r.sharing != MPS_STRATEGY or r.name in self._ready]

    def changed(self, watcher: Watcher) -> bool:
        """Watch the marker directories, then say whether a marker came or went since `filter`."""
        if not self._names or self._root is None:
            return False
        for name in self._names:
            directory = self._root.resource_dir(name)
            while not directory.is_dir() and directory.parent != directory:
                directory = directory.parent
            watcher.add(directory)
        return self._present() != self._ready

    def _present(self) -> frozenset[str]:
        root = self._root
        if root is None:
            return frozenset()
        return frozenset(n for n in self._names if root.marker(n).exists())
