"""A fleet-wide ConfigMap edit, spread over time: every node's config-manager hears it on its watch in
the same second, and applying it at once would make the whole fleet reload (re-register with the
kubelet, republish, write its Event) in that second.

`Spread` hands each change heard after the first to the manager after a random delay of up to
`--configmap-spread` (10 s by default; 0: at once), uniform, drawn per node. The first state (the
list at start) goes at once: a starting pod does not wait. A change heard while one waits replaces it
and keeps its delay, so the newest state is what applies. The mounted copy, which the kubelet
refreshes on each node at its own time, is not delayed.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_SPREAD_S = 10.0


class Spread(Generic[T]):
    """`spread(data, listed)`: `apply(data, listed)` now (the first call, or `max_delay` 0) or after
    `random() * max_delay` seconds. `close()` drops a change still waiting. Thread-safe."""

    def __init__(
        self,
        apply: Callable[[T, bool], None],
        max_delay: float,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        self._apply = apply
        self._max_delay = max_delay
        self._fraction = random_fraction
        self._lock = threading.Lock()
        self._first = True
        self._pending: tuple[T, bool] | None = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def __call__(self, data: T, listed: bool) -> None:
        with self._lock:
            if self._closed:
                return
            at_once, self._first = self._first or self._max_delay <= 0, False
            if not at_once:
                self._pending = (data, listed)
                if self._timer is None:
                    self._timer = threading.Timer(self._fraction() * self._max_delay, self._fire)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self._apply(data, listed)

    def _fire(self) -> None:
        with self._lock:
            pending, self._pending, self._timer = self._pending, None, None
            if self._closed:
                return
        if pending is not None:
            self._apply(*pending)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            timer, self._timer, self._pending = self._timer, None, None
        if timer is not None:
            timer.cancel()
