"""Whether a plugin's main loop (`nvdp.plugins.kubeletplugin.serve_loop`) is alive, for /healthz: each wake
is taken up, and each turn ends, within STUCK_AFTER_S. Nothing ticks while nothing happens: a loop
asleep with nothing to do is alive, and costs no wake-ups to say so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STUCK_AFTER_S = 60.0  # a wake not taken up, or one turn of the main loop, this long: not live


class LoopWatch:
    """`woken()` (any thread) when the loop is asked to do something; the loop says `busy(what)` when
    it takes up its wakes and `idle()` when it goes back to waiting. `problem()`: why it is stuck."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._woken: float | None = None  # when a wake not yet taken up came
        self._busy: tuple[str, float] | None = None  # what the loop is at, since when

    def woken(self) -> None:
        with self._lock:
            if self._woken is None:
                self._woken = self._clock()

    def busy(self, what: str) -> None:
        with self._lock:
            self._woken, self._busy = None, (what, self._clock())

    def idle(self) -> None:
        with self._lock:
            self._busy = None

    def problem(self) -> str | None:
        """None while the loop is alive, else why it looks stuck (one line)."""
        with self._lock:
            woken, busy = self._woken, self._busy
        now = self._clock()
        if busy is not None and now - busy[1] >= STUCK_AFTER_S:
            return f"main loop stuck: busy with {busy[0]} for {now - busy[1]:.0f}s"
        if woken is not None and now - woken >= STUCK_AFTER_S:
            return f"main loop stuck: woken {now - woken:.0f}s ago and not yet taken up"
        return None
