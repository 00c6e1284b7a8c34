"""The skeleton of a kubelet plugin's main loop, the device plugin's (`nvdp.plugins.deviceplugin.supervisor`)
and the DRA plugin's (`nvdp.plugins.dra.loop`):

- it sleeps in one directory watch (`attach`ed once the directory is there) and wakes for what
  changes there, for a named wake from any thread (`wake("reload")`; a signal handler's included),
  a stop, or a timer the caller names;
- it keeps its unix-socket servers listening (`keep_serving`): one that cannot listen is started
  again with backoff (`ListenRetry`), one whose socket file was removed or replaced is served again;
- `watch` (`LoopWatch`) says for /healthz whether it takes up its wakes in good time.

Nothing ticks while nothing happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from nvdp.base.dir_watch import Watcher
from nvdp.plugins.kubeletplugin.listen_retry import ListenRetry
from nvdp.plugins.kubeletplugin.loop_watch import LoopWatch


class Servable(Protocol):
    """A server on a unix socket (`UnixSocketServer`, a `DevicePluginServer`)."""

    @property
    def socket_path(self) -> Path: ...
    def start(self) -> None: ...
    def stop(self, grace: float = 0.5) -> None: ...
    def socket_is_ours(self) -> bool: ...


S = TypeVar("S", bound=Servable)


class ServeLoop:
    """Wakes, a stop, and the servers kept listening, for one main loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.stopped = threading.Event()
        self.listen = ListenRetry(clock)  # the servers that could not listen
        self.watch = LoopWatch(clock)
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._watcher: Watcher | None = None

    # ---- any thread ---------------------------------------------------------------------------------
    def wake(self, what: str) -> bool:
        """Ask the loop to do `what`; True when that made it pending (False: it already was)."""
        with self._lock:
            newly = what not in self._pending
            self._pending.add(what)
        self.watch.woken()
        self._nudge()
        return newly

    def waker(self, what: str) -> Callable[[], None]:
        """What wakes the loop to do `what` (a part's callback)."""

        def wake() -> None:
            self.wake(what)

        return wake

    def request_stop(self) -> None:
        self.stopped.set()
        self._nudge()

    def _nudge(self) -> None:
        watcher = self._watcher
        if watcher is not None:
            watcher.wake()

    # ---- the loop's thread --------------------------------------------------------------------------
    def attach(self, watcher: Watcher) -> None:
        """The watch the loop sleeps in (a wake asked before it came ends the first sleep)."""
        self._watcher = watcher
        with self._lock:
            pending = bool(self._pending)
        if pending or self.stopped.is_set():
            watcher.wake()

    @property
    def watcher(self) -> Watcher:
        assert self._watcher is not None, "attach() first"
        return self._watcher

    def take(self) -> set[str]:
        """The wakes asked since the last take."""
        with self._lock:
            pending, self._pending = self._pending, set()
        return pending

    def wait(self, timeout: float | None) -> set[str]:
        """Sleep until a change, a wake, a stop or `timeout`; then the wakes asked (empty: a change in
        the watched directories, or the timer)."""
        self.watch.idle()
        self.watcher.wait(timeout)
        taken = self.take()
        self.watch.busy(",".join(sorted(taken)) or "a directory change")
        return taken

    def keep_serving(
        self, servers: Sequence[tuple[str, S]], removed: Callable[[str, S], S], *, in_order: bool = False
    ) -> list[str]:
        """Keep `servers` (name, server) listening: one that could not listen is started again when its
        retry is due; one that listened and whose socket file is no longer its own is handed to
        `removed(name, server)` (say it, stop it, give back what to start in its place) and started.
        `in_order`: a server that does not listen holds back those after it (a registration socket
        waits for the service socket it names). Returns the names of the servers started."""
        due = self.listen.take_due()
        failing = self.listen.failing
        started: list[str] = []
        for name, server in servers:
            if name in failing:
                if not due:
                    if in_order:
                        break
                    continue
            elif server.socket_is_ours():
                continue
            else:
                server = removed(name, server)
            if self.listen.start(name, server.start):
                started.append(name)
            elif in_order:
                break
        return started


def sooner(*delays: float | None) -> float | None:
    """The shortest of optional delays (None: no timer)."""
    return min((d for d in delays if d is not None), default=None)
