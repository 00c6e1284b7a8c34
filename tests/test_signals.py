"""`nvdp.base.signals` in a real process (tests/signal_target.py): a SIGHUP storm coalesces into a few
reloads and the process keeps running; the first SIGTERM stops it, logged once; a second SIGTERM,
or a stop that does not finish within the deadline, abandons (cleanup) and exits 1 at once; a
signal that comes before the command is attached is kept for it; `close()` restores what was there."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from nvdp.base.signals import ABANDON_BUDGET_S, STOP_DEADLINE_S, SignalHandling
from testkit import Process, clean_env, wait_until
from tests.signal_storm import storm


def target(tmp_path: Path, *extra: str) -> Process:
    argv = [sys.executable, "-m", "tests.signal_target", str(tmp_path), *extra]
    process = Process(argv, tmp_path / "target.log", clean_env())
    return process


def started(tmp_path: Path, *extra: str) -> Process:
    process = target(tmp_path, *extra)
    wait_until(lambda: (tmp_path / "ready").exists(), 20, "loop running")
    return process


def log_lines_with(process: Process, text: str) -> list[str]:
    return [line for line in process.log().splitlines() if text in line]


def test_sighup_storm_coalesces_then_sigterm_stops_once(tmp_path: Path) -> None:
    with started(tmp_path) as process:
        sent = storm(process)
        assert process.alive(), process.log()[-3000:]
        assert sent >= 1000
        done = lambda: log_lines_with(process, "reload done")  # noqa: E731
        wait_until(
            lambda: len(done()) >= len(log_lines_with(process, "SIGHUP received; reloading")), 10, "reloads"
        )
        requested = len(log_lines_with(process, "SIGHUP received; reloading"))
        # Each reload takes 20 ms: the storm's thousands of signals fold into the pending one.
        assert 1 <= requested <= len(done()) + 1
        assert len(done()) < sent / 5, (len(done()), sent)
        began = time.monotonic()
        process.send(signal.SIGTERM)
        assert process.wait(5) == 0
        assert time.monotonic() - began < 2.0
    log = process.log()
    assert len(log_lines_with(process, "signal received; stopping signal=SIGTERM")) == 1
    assert "loop ended" in log and "Traceback" not in log
    assert not (tmp_path / "abandoned").exists()


def test_a_stop_that_does_not_finish_is_abandoned_at_the_deadline(tmp_path: Path) -> None:
    with started(tmp_path, "--stop-blocks", "--deadline", "1") as process:
        began = time.monotonic()
        process.send(signal.SIGTERM)
        assert process.wait(10) == 1
        took = time.monotonic() - began
    assert 1.0 <= took < 1.0 + ABANDON_BUDGET_S + 2.0, took
    assert (tmp_path / "abandoned").exists()
    assert log_lines_with(process, "ERROR   stop did not finish within 1s; exiting now status=1")
    assert "loop ended" not in process.log()


def test_a_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    with started(tmp_path, "--stop-blocks", "--deadline", "30") as process:
        process.send(signal.SIGTERM)
        wait_until(lambda: log_lines_with(process, "signal received; stopping"), 10, "first stop")
        began = time.monotonic()
        process.send(signal.SIGTERM)
        assert process.wait(10) == 1
        assert time.monotonic() - began < 2.0
    assert (tmp_path / "abandoned").exists()
    assert log_lines_with(process, "second SIGTERM; exiting now without waiting for the stop")


def test_sigint_stops_too_and_sighup_after_a_stop_is_ignored(tmp_path: Path) -> None:
    with started(tmp_path, "--stop-blocks", "--deadline", "1") as process:
        process.send(signal.SIGINT)
        wait_until(lambda: log_lines_with(process, "signal received; stopping signal=SIGINT"), 10, "stop")
        storm(process, burst=500, spaced=0)  # the loop is stuck in its stop: reloads would pile up on it
        assert process.wait(10) == 1
    assert not log_lines_with(process, "SIGHUP received")
    assert (tmp_path / "abandoned").exists()


def test_signals_before_the_command_is_attached_are_kept(tmp_path: Path) -> None:
    process = target(tmp_path, "--attach-on-file")
    with process:
        wait_until(lambda: (tmp_path / "installed").exists(), 20, "handlers installed")
        storm(process, burst=200, spaced=0)  # the default action of SIGHUP would end the process here
        wait_until(lambda: log_lines_with(process, "SIGHUP received; reloading"), 10, "reload kept")
        process.send(signal.SIGTERM)
        wait_until(lambda: log_lines_with(process, "signal received; stopping"), 10, "stop line")
        assert process.alive()
        (tmp_path / "attach").touch()
        assert process.wait(10) == 0
    log = process.log()
    assert log.index("signal received; stopping") < log.index("attached") < log.index("loop ended")
    assert len(log_lines_with(process, "SIGHUP received; reloading")) == 1  # one pending reload, not 200


def test_the_deadline_leaves_room_in_kubernetes_default_grace_period() -> None:
    assert STOP_DEADLINE_S + ABANDON_BUDGET_S <= 30 / 2


def test_close_puts_the_previous_handlers_and_wakeup_fd_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    handling = SignalHandling().install()
    try:
        assert all(signal.getsignal(s) is not before[s] for s in before)
        assert any(t.name == "signals" for t in threading.enumerate())
    finally:
        handling.close()
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(-1) == -1  # none was set before
    assert not any(t.name == "signals" for t in threading.enumerate())
    handling.close()  # idempotent
