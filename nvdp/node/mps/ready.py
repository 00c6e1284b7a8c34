"""The plugin's side of MPS readiness: an MPS resource is served only while its control daemon's
ready marker `<root>/<resource>/.started` exists.

- `MpsReadiness.filter` leaves out an MPS resource without its marker, with a misfit
  (`MpsDaemonNotReady`, withholding it, so `/readyz` fails) naming the daemon's reason
  (`nvdp.node.mps.status`) or that no marker is there yet.
- `changed()`, asked at every wake, adds the marker directories (or their nearest existing
  parent) to the supervisor's inotify watch: a marker or status change wakes it; no polling.
- Each level is watched before the one below is looked at, so a directory made meanwhile is seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from nvdp.base.dir_watch import Watcher
from nvdp.config.model import MPS
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import NodeResources, Resource

from .layout import MpsRoot
from .status import read_status

REASON = "MpsDaemonNotReady"


class MpsReadiness:
    def __init__(self) -> None:
        self._root: MpsRoot | None = None
        self._names: tuple[str, ...] = ()  # the MPS resources of the last build
        self._state: Mapping[str, str | None] = {}  # each of them -> None when ready, else why not

    def filter(self, resources: Sequence[Resource], root: str | None) -> NodeResources:
        """The resources to serve now (MPS ones only while their marker exists), and a misfit for
        each MPS resource left out."""
        self._names = tuple(r.name for r in resources if r.sharing == MPS)
        self._root = MpsRoot(Path(root)) if root else None
        self._state = self._look()
        misfits = tuple(
            Misfit(
                REASON,
                name,
                f"{name}: waiting for the MPS control daemon{why}; not advertised",
                withholds=(name,),
            )
            for name, why in self._state.items()
            if why is not None
        )
        served = [r for r in resources if r.sharing != MPS or self._state.get(r.name) is None]
        return NodeResources(served, misfits)

    def changed(self, watcher: Watcher) -> bool:
        """Watch the marker directories, then say whether a marker or status changed since `filter`."""
        if not self._names or self._root is None:
            return False
        for name in self._names:
            _watch_down_to(self._root.resource_dir(name), watcher)
        return self._look() != self._state

    def _look(self) -> dict[str, str | None]:
        """Each MPS resource -> None when its marker exists, else `: <reason>` from its status file,
        or where the marker is awaited."""
        root = self._root
        if root is None:
            return dict.fromkeys(self._names, " (no MPS root set)")
        state: dict[str, str | None] = {}
        for name in self._names:
            if root.marker(name).exists():
                state[name] = None
                continue
            reason = read_status(root.status(name))
            state[name] = f": {reason}" if reason else f" (no ready marker at {root.marker(name)})"
        return state


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
