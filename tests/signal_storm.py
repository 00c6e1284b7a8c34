"""Signal storms for the tests: thousands of signals to a process, back to back and then at
sub-millisecond spacing (the first finds handlers still running, the second reloads in progress)."""

from __future__ import annotations

import os
import signal
import time

from testkit import Process

BURST = 2000  # back to back
SPACED = 1000  # then one every SPACING_S
SPACING_S = 0.0002
BUDGET_S = 8.0


def storm(
    process: Process,
    sig: signal.Signals = signal.SIGHUP,
    burst: int = BURST,
    spaced: int = SPACED,
    budget: float = BUDGET_S,
) -> int:
    """Send `sig` `burst` times back to back, then `spaced` times SPACING_S apart, for at most
    `budget` seconds in all (a loaded machine sends fewer); stop early when the process has ended.
    Returns how many were sent."""
    deadline = time.monotonic() + budget
    sent = 0
    while sent < burst + spaced and time.monotonic() < deadline:
        if not process.alive():  # reaped only here: its pid cannot be someone else's yet
            break
        os.kill(process.pid, sig)
        sent += 1
        if sent > burst:
            time.sleep(SPACING_S)  # pacing the storm, not waiting for anything
    return sent
