"""How many events one subject (a GPU's transitions on the Node, one pod's faults on one GPU) may
post to the API server in a window: a GPU that flaps must not turn into a stream of API writes.

The first PER_SUBJECT events of a subject in WINDOW_S go out; the rest of that window's are counted
and left out, with one warning line when a subject first goes over. The log lines of the transitions
themselves are never left out; the metrics always show the current health.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from nvdp.base.logs import log_event
from nvdp.base.units import format_go_duration

log = logging.getLogger(__name__)

PER_SUBJECT = 4  # two unhealthy-and-back cycles
WINDOW_S = 600.0


class EventBudget:
    """Thread-safe."""

    def __init__(
        self,
        per_subject: int = PER_SUBJECT,
        window: float = WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_subject, self._window, self._clock = per_subject, window, clock
        self._lock = threading.Lock()
        self._sent: dict[Hashable, deque[float]] = {}  # subject -> when its events went out
        self._over: set[Hashable] = set()  # subjects over budget in their current window
        self.suppressed = 0

    def allow(self, subject: Hashable, what: str) -> bool:
        """Whether one more event of `subject` may go out now (`what` names it in the warning)."""
        with self._lock:
            now = self._clock()
            self._forget_before(now - self._window)
            sent = self._sent.setdefault(subject, deque())
            if len(sent) < self._per_subject:
                sent.append(now)
                self._over.discard(subject)
                return True
            self.suppressed += 1
            first = subject not in self._over
            self._over.add(subject)
        if first:
            log_event(
                log,
                logging.WARNING,
                "events left out: too many for one subject",
                subject=what,
                limit=self._per_subject,
                window=format_go_duration(self._window),
            )
        return False

    def _forget_before(self, cutoff: float) -> None:
        for subject in list(self._sent):
            sent = self._sent[subject]
            while sent and sent[0] <= cutoff:
                sent.popleft()
            if not sent:
                del self._sent[subject]
                self._over.discard(subject)
