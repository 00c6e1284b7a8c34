"""A small command for tests/test_signals.py, run as a process: `nvdp.base.signals` installed as the real
commands install it, around a loop that sleeps on a wake-up pipe, takes each pending reload (which
takes RELOAD_S, so that SIGHUPs arrive during it) and stops when asked.

`python -m tests.signal_target STATE_DIR [--deadline S] [--stop-blocks] [--attach-on-file]`:
`--stop-blocks` makes the loop block for good when it sees the stop (as one stuck in a hung call);
`--attach-on-file` attaches the loop only once STATE_DIR/attach exists (signals that come before
are kept). It writes STATE_DIR/ready when its loop runs and STATE_DIR/abandoned when abandoned.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
import threading
import time
from pathlib import Path

from nvdp.base.logs import log_event, setup_logging
from nvdp.base.signals import SignalHandling, SignalTarget

log = logging.getLogger("signal_target")
RELOAD_S = 0.02


class Loop:
    def __init__(self, state: Path, stop_blocks: bool) -> None:
        self.state = state
        self.stop_blocks = stop_blocks
        self.stopping = False
        self.reload_pending = False
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def request_stop(self) -> None:
        self.stopping = True
        os.write(self._write, b"x")

    def request_reload(self) -> bool:
        newly = not self.reload_pending
        self.reload_pending = True
        os.write(self._write, b"x")
        return newly

    def abandon(self) -> None:
        (self.state / "abandoned").write_text("abandoned\n")

    def run(self) -> None:
        (self.state / "ready").touch()
        reloads = 0
        while not self.stopping:
            if self.reload_pending:
                self.reload_pending = False
                time.sleep(RELOAD_S)  # the reload's work
                reloads += 1
                log_event(log, logging.INFO, "reload done", reloads=reloads)
            select.select([self._read], [], [], None)
            try:
                os.read(self._read, 4096)
            except BlockingIOError:
                pass
        if self.stop_blocks:
            held = threading.Lock()
            held.acquire()
            held.acquire()  # blocked in C for good, as a loop stuck in a hung call
        log_event(log, logging.INFO, "loop ended", reloads=reloads)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("state", type=Path)
    parser.add_argument("--deadline", type=float, default=10.0)
    parser.add_argument("--stop-blocks", action="store_true")
    parser.add_argument("--attach-on-file", action="store_true")
    args = parser.parse_args()
    setup_logging("text", "info")
    signals = SignalHandling(deadline=args.deadline).install()
    loop = Loop(args.state, args.stop_blocks)
    if args.attach_on_file:
        (args.state / "installed").touch()
        while not (args.state / "attach").exists():
            time.sleep(0.01)
    signals.attach(SignalTarget(loop.request_stop, loop.request_reload, loop.abandon))
    log_event(log, logging.INFO, "attached")
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
