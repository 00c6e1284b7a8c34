"""Signals of every long-running nvdp command, in one place: SIGTERM / SIGINT stop, SIGHUP reloads.

- Handlers do nothing: CPython's C handler writes the signal to a wake-up pipe
  (`signal.set_wakeup_fd`), and a dispatcher thread reads it, free to log and take locks.
- SIGHUP calls `reload()`; those within RELOAD_INTERVAL_S of the last request, or while one is
  pending, fold into one (at most ten a second); only a reload made pending is logged.
- The first SIGTERM / SIGINT calls `stop()`, logged once; later SIGHUPs are ignored.
- A second one, or a stop not done within STOP_DEADLINE_S: `abandon()` removes what must not outlive
  the process (sockets, directory lock, ready markers; compute modes restored) within
  ABANDON_BUDGET_S, logs one ERROR and exits 1 at once (10 s + 2 s is well inside Kubernetes' 30 s).
- A signal that comes while the command is being built is delivered by `attach()`.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from nvdp.base.logs import log_event
from nvdp.base.timers import TIMERS

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNAL = signal.SIGHUP
STOP_DEADLINE_S = TIMERS.stop_deadline  # from the first stop signal to a forced exit (10 s)
ABANDON_BUDGET_S = 2.0  # the most a forced exit waits for `abandon()`
RELOAD_INTERVAL_S = 0.1  # SIGHUPs closer than this to the last reload request wait for its end
FORCED_EXIT_STATUS = 1
_STOP_NUMBERS = frozenset(int(signum) for signum in STOP_SIGNALS)
_RELOAD_NUMBER = int(RELOAD_SIGNAL)
_CLOSE = b"\0"  # no signal has number 0: written by close() to wake the dispatcher
_READ_SIZE = 65536


Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _nothing(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: the C-level one already wrote the signal into the wake-up pipe."""


def _no_cleanup() -> None:
    """`abandon()` of a command with nothing that could outlive it."""


@dataclass(frozen=True)
class SignalTarget:
    """What a command gives the signals. Each is called on the dispatcher thread, never in a handler.

    `stop()` asks the command's loop to end (it must not block); `reload()` asks for a reload and
    answers True when that made one pending, False when one was already pending; `abandon()` removes
    what must not outlive a process whose stop did not finish, without waiting for the loop (any
    thread may call it; it should be quick, and is cut off after ABANDON_BUDGET_S)."""

    stop: Callable[[], None]
    reload: Callable[[], bool]
    abandon: Callable[[], None] = _no_cleanup


class SignalHandling:
    """Installed once per process, on the main thread, before the command is built: `install()`;
    then `attach(target)` once the command exists. `close()` puts the previous handlers back (tests
    run it in-process; a command leaves it installed until the process exits, so that the deadline
    also covers what happens after its loop returned, such as joining threads at exit)."""

    def __init__(
        self,
        *,
        deadline: float = STOP_DEADLINE_S,
        abandon_budget: float = ABANDON_BUDGET_S,
        reload_interval: float = RELOAD_INTERVAL_S,
        exit: Callable[[int], object] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deadline = deadline
        self._abandon_budget = abandon_budget
        self._reload_interval = reload_interval
        self._next_reload = 0.0  # monotonic time before which SIGHUPs are held back
        self._exit = exit
        self._clock = clock
        self._lock = threading.Lock()  # guards the target and what is pending for it
        self._target: SignalTarget | None = None
        self._pending_stop = False
        self._pending_reload = False
        self._stop_at: float | None = None  # monotonic deadline once a stop signal came
        self._read = self._write = -1
        self._previous_fd = -1
        self._previous: dict[signal.Signals, Handler] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self.reloads = 0  # reloads that a SIGHUP made pending

    # ---- set-up (main thread) ---------------------------------------------------------------------
    def install(self) -> SignalHandling:
        """Take over SIGTERM, SIGINT and SIGHUP. Main thread only (as `signal.signal` requires)."""
        if self._thread is not None:
            return self
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # The pipe first, then the handlers: no signal between the two is lost.
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in (*STOP_SIGNALS, RELOAD_SIGNAL):
            self._previous[signum] = signal.signal(signum, _nothing)
            # SA_RESTART: a blocking call in any thread (gRPC's, NVML's) resumes instead of seeing
            # EINTR thousands of times in a storm. The dispatcher wakes on the pipe regardless.
            signal.siginterrupt(signum, False)
        self._thread = threading.Thread(target=self._dispatch, name="signals", daemon=True)
        self._thread.start()
        return self

    def attach(self, target: SignalTarget) -> None:
        """Hand the signals to `target`; a stop or reload that came before is delivered now."""
        with self._lock:
            self._target = target
            stop, reload = self._pending_stop, self._pending_reload
        if stop:
            target.stop()
        elif reload:
            target.reload()

    def close(self) -> None:
        """Put the previous handlers and wake-up descriptor back and end the dispatcher. Main thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        self._closing = True
        try:
            os.write(self._write, _CLOSE)
        except BlockingIOError:  # a full pipe wakes the dispatcher anyway, and it sees _closing
            pass
        thread.join()
        for fd in (self._read, self._write):
            os.close(fd)
        self._read = self._write = -1

    # ---- the dispatcher thread --------------------------------------------------------------------
    def _dispatch(self) -> None:
        held = 0  # SIGHUPs read but not yet passed on: the last reload request was too recent
        while True:
            now = self._clock()
            if self._stop_at is not None and now >= self._stop_at:  # first: a storm keeps the pipe busy
                self._force_exit(f"stop did not finish within {self._deadline:g}s; exiting now")
                return
            if held and self._stop_at is None and now >= self._next_reload:
                self._reload(held)
                held = 0
            wakes = [t for t in (self._stop_at, self._next_reload if held else None) if t is not None]
            timeout = max(0.0, min(wakes) - now) if wakes else None
            readable, _, _ = select.select([self._read], [], [], timeout)
            if not readable:
                continue
            try:
                data = os.read(self._read, _READ_SIZE)
            except BlockingIOError:
                continue
            if self._closing:
                return
            stops = [signal.Signals(number) for number in data if number in _STOP_NUMBERS]
            for signum in stops:
                if self._stop_at is not None:
                    self._force_exit(f"second {signum.name}; exiting now without waiting for the stop")
                    return
                self._stop(signum)
            if self._stop_at is None:
                held += data.count(_RELOAD_NUMBER)

    def _stop(self, signum: signal.Signals) -> None:
        self._stop_at = self._clock() + self._deadline
        with self._lock:
            target = self._target
            self._pending_stop = target is None
        # Logged first: once stopped, the process may end before this thread logs anything.
        log_event(log, logging.INFO, "signal received; stopping", signal=signum.name)
        if target is not None:
            target.stop()

    def _reload(self, count: int) -> None:
        self._next_reload = self._clock() + self._reload_interval
        with self._lock:
            target = self._target
            if target is None:
                newly = not self._pending_reload
                self._pending_reload = True
        if target is not None:
            newly = target.reload()
        if newly:
            self.reloads += 1
            log_event(log, logging.INFO, "SIGHUP received; reloading")
        else:
            log_event(log, logging.DEBUG, "SIGHUP coalesced into the pending reload", signals=count)

    def _force_exit(self, reason: str) -> None:
        """`abandon()` and the ERROR line on a thread of their own, waited for at most the budget
        (either may block: a log handler held by a stuck thread, a hung NVML call), then exit."""
        with self._lock:
            target = self._target

        def last_words() -> None:
            try:
                if target is not None:
                    target.abandon()
            finally:
                log_event(log, logging.ERROR, reason, status=FORCED_EXIT_STATUS)

        helper = threading.Thread(target=last_words, name="signals-abandon", daemon=True)
        helper.start()
        helper.join(self._abandon_budget)
        self._exit(FORCED_EXIT_STATUS)


def handle_signals() -> SignalHandling:
    """Install signal handling for a long-running command (main thread, as early as possible)."""
    return SignalHandling().install()
