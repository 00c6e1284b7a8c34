"""The kubelet's Node status updates, for the device plugins' resources: the stand-in's device counts
(`Kubelet.node_counts`: capacity and allocatable) handed to `write` `delay` seconds after they changed,
as the kubelet's status update (every `nodeStatusUpdateFrequency`) lets the Node lag its device
manager. The counts are sampled every `tick` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nvdp.sim.kubelet.manager import Kubelet

Counts = dict[str, int]
StatusWriter = Callable[[Counts, Counts], None]  # (capacity, allocatable)


class NodeStatusMirror:
    """`start()`, an idempotent `stop()`; `write(capacity, allocatable)` runs on the mirror's thread."""

    def __init__(self, kubelet: Kubelet, write: StatusWriter, delay: float, *, tick: float = 0.01) -> None:
        self._kubelet = kubelet
        self._write = write
        self.delay = delay
        self._tick = tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node-status", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> NodeStatusMirror:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        pending: list[tuple[float, tuple[Counts, Counts]]] = []  # (when to write, the counts)
        seen: tuple[Counts, Counts] | None = None
        written: tuple[Counts, Counts] | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            counts = self._kubelet.node_counts()
            if counts != seen:
                seen = counts
                pending.append((now + self.delay, counts))
            due = [c for at, c in pending if at <= now]
            pending = [(at, c) for at, c in pending if at > now]
            if due and due[-1] != written:
                written = due[-1]
                self._write(*written)
            self._stop.wait(self._tick)
