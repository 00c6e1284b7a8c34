"""Retry delays: the one capped exponential backoff of every nvdp retry loop, and its stop-aware wait.

`delay_after(failures, initial, maximum)` is the sequence itself, pure: no wait before a failure, then
`initial`, twice that, four times that, ... never more than `maximum`. `Backoff` counts the failures of
one loop: `next()` is the wait after one more, `reset()` starts over after a success, `wait(stop)` waits
the next delay unless a stop comes first. With `jitter` each wait is stretched by a random factor in
[1, 1 + jitter), and with `reset_after` it starts over by itself when the previous wait is more than that
many seconds old: client-go's reflector backs off its re-lists so (`wait.NewExponentialBackoffManager`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable


def delay_after(failures: int, initial: float, maximum: float) -> float:
    """The wait after `failures` failures in a row: 0 after none, then initial * 2**(failures - 1),
    never more than `maximum`."""
    if failures <= 0:
        return 0.0
    return float(min(maximum, initial * 2.0 ** min(failures - 1, 64)))


class Backoff:
    """The waits of one retry loop (see the module); `clock` and `uniform` (a float in [0, 1)) are
    injected by tests."""

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        jitter: float = 0.0,
        reset_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._initial, self._maximum = initial, maximum
        self._jitter, self._reset_after = jitter, reset_after
        self._clock, self._uniform = clock, uniform
        self._failures = 0
        self._last: float | None = None  # the clock at the previous next(), with reset_after

    def next(self) -> float:
        """The wait after one more failure."""
        if self._reset_after is not None:
            now = self._clock()
            if self._last is not None and now - self._last > self._reset_after:
                self._failures = 0
            self._last = now
        self._failures += 1
        wait = delay_after(self._failures, self._initial, self._maximum)
        return wait * (1 + self._jitter * self._uniform()) if self._jitter else wait

    def reset(self) -> None:
        """A success: the next failure waits `initial` again."""
        self._failures = 0

    def wait(self, stop: Callable[[float], bool]) -> bool:
        """Wait the next delay on `stop` (waits up to N seconds, True when stopped: `Event.wait`);
        True when the stop came first."""
        return stop(self.next())
