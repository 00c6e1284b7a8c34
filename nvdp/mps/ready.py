"""The plugin's side of MPS readiness: an MPS resource is served only while its control daemon's
ready marker `<root>/<resource>/.started` exists.

The supervisor filters the resources it builds through `MpsReadiness.filter` and, on every wake-up
of its directory watcher, asks `changed()`: the marker directories (or their nearest existing
parent, before the daemon has created them) are added to the same inotify watch, so a marker that
appears or goes wakes the supervisor at once; there is no polling loop. Each level is watched before
the one below it is looked at, so a directory the daemon creates meanwhile is never missed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from nvdp.logs import log_event
from nvdp.resources import Resource

from .layout import MpsRoot
from .plan import MPS_STRATEGY

log = logging.getLogger(__name__)


class Watcher(Protocol):
    def add(self, directory: Path) -> bool: ...


class MpsReadiness:
    def __init__(self) -> None:
        self._root: MpsRoot | None = None
        self._names: tuple[str, ...] = ()  # the MPS resources of the last build
        self._ready: frozenset[str] = frozenset()  # those of them with a marker then

    def filter(self, resources: Sequence[Resource], root: str | None) -> list[Resource]:
        """The resources to serve now: MPS ones only while their marker exists."""
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
            _watch_down_to(self._root.resource_dir(name), watcher)
        return self._present() != self._ready

    def _present(self) -> frozenset[str]:
        root = self._root
        if root is None:
            return frozenset()
        return frozenset(n for n in self._names if root.marker(n).exists())


def _watch_down_to(directory: Path, watcher: Watcher) -> None:
    """Watch `directory`, or its nearest existing parent while it does not exist yet.

    Top down, each level is watched before the one below it is looked at: the daemon creates
    `<root>/<resource>` while the plugin looks, and a directory made between a look that missed it
    and the watch on its parent would never wake the supervisor (nor would the marker made in it).
    Here it is either seen by the next look, and watched in turn, or its creation wakes the watcher.
    """
    chain = [directory, *directory.parents]  # deepest first; the last, "/", always exists
    level = next(i for i, d in enumerate(chain) if d.is_dir() or i == len(chain) - 1)
    watcher.add(chain[level])
    while level > 0 and chain[level - 1].is_dir():
        level -= 1
        watcher.add(chain[level])
