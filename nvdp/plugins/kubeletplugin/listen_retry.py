"""Starting plugin servers whose socket may not be bindable now, and retrying those that fail.

A server that cannot listen on its socket (the kubelet directory read-only, full, replaced by a
file) is a node fact that can be fixed under a running pod: the plugin keeps the server, its other
servers keep serving, and the failed ones are tried again with backoff (50 ms doubling to 5 s) until
they listen. Each failure is one ERROR line, said again only when its error changes, and the
recovery one INFO line; `/readyz` reads the errors (`failing`). Starting and the backoff are this
module's one job; the main loop (`nvdp.plugins.kubeletplugin.serve_loop`) decides when to start what.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nvdp.base.backoff import Backoff
from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.05
RETRY_MAX_S = 5.0


class ListenRetry:
    """Starts servers; remembers which could not listen, and when to try them again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.failing: dict[str, str] = {}  # server's name -> why its server does not listen
        self._retries = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        self._next: float | None = None  # when failing servers are tried again

    def start(self, name: str, start: Callable[[], None]) -> bool:
        """`start()` the server named `name` (a resource, a socket path): True when it listens. A
        failure (NvdpError, one line) is said once per error and schedules a retry."""
        try:
            start()
        except NvdpError as error:
            text = str(error)
            if self.failing.get(name) != text:
                log_event(
                    log, logging.ERROR, "plugin server cannot listen; retrying", resource=name, error=text
                )
            self.failing[name] = text
            if self._next is None:
                self._next = self._clock() + self._retries.next()
            return False
        if name in self.failing:
            log_event(log, logging.INFO, "plugin server listening again", resource=name)
            self.forget(name)
        return True

    def forget(self, name: str) -> None:
        """No server to start for `name` any more (removed, or it listens)."""
        self.failing.pop(name, None)
        if not self.failing:
            self._retries.reset()
            self._next = None

    def take_due(self) -> bool:
        """Whether the failing servers are to be tried again now; the next retry, if they fail
        again, waits twice as long."""
        if self._next is None or self._clock() < self._next:
            return False
        self._next = None
        return True

    def retry_in(self) -> float | None:
        """Seconds until the next retry, None when nothing is failing."""
        return None if self._next is None else max(0.0, self._next - self._clock())
