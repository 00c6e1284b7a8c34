"""The Node's count of the device plugin's resources against what the device plugin lists: a GPU the
DRA driver takes over is published only once the Node no longer counts it, so the scheduler never
sees one GPU in both APIs (the kubelet updates the Node seconds after ListAndWatch changes).

- `still_counted` (pure), per resource of the device plugin's hand-over record: where it lists
  devices, Node capacity must be at most their number; where it lists none, allocatable must be 0.
- `NodeCountGate` reads the Node while a GPU waits (every POLL_S; after WARN_S it says so once,
  reports each GPU as a misfit, and reads every SLOW_POLL_S), and lets GPUs through once that holds.
- A Node that cannot be read keeps them waiting (read again after SLOW_POLL_S by the main loop);
  without a Node nothing counts them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping

from nvdp.base.errors import KubeError
from nvdp.base.logs import log_event
from nvdp.node.gpus.misfits import Misfit
from nvdp.plugins.dra.cluster import NodeCounts, ResourceApi

log = logging.getLogger(__name__)

POLL_S = 0.5
SLOW_POLL_S = 5.0
WARN_S = 30.0
_QUANTITY = re.compile(r"([0-9]+)([kMGTPE]?)")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def still_counted(node: NodeCounts, units: Mapping[str, int]) -> list[str]:
    """The resources the Node counts more devices of than the device plugin lists (`units`: resource
    name -> devices), each said as `name: Node capacity 4 > 3 listed`; none: the rule holds."""
    found = []
    for name, listed in sorted(units.items()):
        field, counts = ("capacity", node.capacity) if listed else ("allocatable", node.allocatable)
        quantity = counts.get(name, "0")
        count = _count(quantity)
        if count is None or count > listed:
            found.append(f"{name}: Node {field} {quantity} > {listed} listed")
    return found


def _count(quantity: str) -> int | None:
    """An extended resource's quantity (a whole number, maybe with a decimal SI suffix); None when it
    is not one (counted as more than any number: the GPU waits)."""
    match = _QUANTITY.fullmatch(quantity.strip())
    return int(match[1]) * _SUFFIX[match[2]] if match else None


class NodeCountGate:
    """`offer` says which GPUs to offer now; `retry_in`/`due` when to ask again while some wait;
    `misfits` those that waited longer than `warn_after`."""

    def __init__(
        self,
        api: ResourceApi,
        node: str,
        *,
        poll: float = POLL_S,
        slow_poll: float = SLOW_POLL_S,
        warn_after: float = WARN_S,
    ) -> None:
        self._api = api
        self.node = node
        self._poll, self._slow_poll, self._warn_after = poll, slow_poll, warn_after
        self._waiting: dict[str, float] = {}  # GPU uuid -> time.monotonic() it began to wait
        self._why: list[str] = []  # what the Node still counts, as last read
        self._unread = False  # the last read failed
        self._next_check = 0.0
        self._warned = False

    def offer(
        self, serve: frozenset[str], offered: frozenset[str], units: Mapping[str, int]
    ) -> frozenset[str]:
        """Of `serve` (the GPUs the hand-over lets the DRA driver serve), those to offer now: those
        `offered` already, and the others once the Node counts no more of the device plugin's
        resources than it lists (`units`, its record's; none: no device plugin to wait for)."""
        new = serve - offered
        now = time.monotonic()
        if new and units and (new - self._waiting.keys() or now >= self._next_check):
            self._why = self._read(units)
        if not new or not units or not self._why:
            self._done(now, serve)
            return serve
        self._waiting = {uuid: self._waiting.get(uuid, now) for uuid in sorted(new)}
        late = now - min(self._waiting.values()) >= self._warn_after
        if late and not self._warned:
            log_event(
                log,
                logging.WARNING,
                "GPUs not offered: the Node still counts the device plugin's devices; waiting",
                node=self.node,
                gpus=",".join(self._waiting),
                counted="; ".join(self._why),
                waited=f"{now - min(self._waiting.values()):.0f}s",
            )
            self._warned = True
        self._next_check = now + (self._slow_poll if late or self._unread else self._poll)
        return serve & offered

    def _read(self, units: Mapping[str, int]) -> list[str]:
        try:
            node = self._api.node_counts(self.node)
        except KubeError as error:
            self._unread = True
            return [str(error)]
        self._unread = False
        return [] if node is None else still_counted(node, units)

    def _done(self, now: float, serve: frozenset[str]) -> None:
        offered = {uuid: since for uuid, since in self._waiting.items() if uuid in serve}
        if offered:
            log_event(
                log,
                logging.INFO,
                "GPUs offered once the Node stopped counting them",
                node=self.node,
                gpus=",".join(offered),
                waited=f"{now - min(offered.values()):.2f}s",
            )
        self._waiting, self._why, self._warned = {}, [], False

    def retry_in(self) -> float | None:
        """Seconds until the Node is read again; None while no GPU waits."""
        return max(0.0, self._next_check - time.monotonic()) if self._waiting else None

    def due(self) -> bool:
        return bool(self._waiting) and time.monotonic() >= self._next_check

    def misfits(self, labels: Mapping[str, str]) -> tuple[Misfit, ...]:
        """The GPUs that waited longer than `warn_after` (`labels`: uuid -> "GPU 3")."""
        now = time.monotonic()
        return tuple(
            Misfit(
                "GpuCountedByNode",
                labels.get(uuid, uuid),
                f"{labels.get(uuid, uuid)} ({uuid}): the config gives it to the DRA driver, but the Node "
                f"still counts the device plugin's devices ({'; '.join(self._why)}); offered once not",
            )
            for uuid, since in self._waiting.items()
            if now - since >= self._warn_after
        )
