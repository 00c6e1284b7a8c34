"""The one backoff helper (`nvdp.base.backoff`): the delay sequence, its cap, reset, jitter and the
stop-aware wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest

from nvdp.base.backoff import Backoff, delay_after


@pytest.mark.parametrize(
    ("initial", "maximum", "failures", "expected"),
    [
        (1.0, 30.0, range(8), [0, 1, 2, 4, 8, 16, 30, 30]),
        (0.05, 5.0, range(1, 9), [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]),
        (0.5, 10.0, range(1, 8), [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),
        (0.1, 0.4, [-1, 0, 1, 3, 10_000], [0, 0, 0.1, 0.4, 0.4]),
    ],
    ids=["mps-restarts", "kubelet-dir", "cdi-publish", "none-before-a-failure-and-no-overflow"],
)
def test_delay_after_failures(
    initial: float, maximum: float, failures: Iterable[int], expected: list[float]
) -> None:
    assert [delay_after(n, initial, maximum) for n in failures] == expected


@pytest.mark.parametrize(
    ("initial", "maximum", "waits"),
    [
        (0.5, 5.0, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]),
        (0.0005, 0.002, [0.0005, 0.001, 0.002, 0.002]),
        (0.05, 0.05, [0.05, 0.05, 0.05]),
    ],
    ids=["doubles-to-the-cap", "milliseconds", "constant"],
)
def test_next_doubles_up_to_the_cap_and_reset_starts_over(
    initial: float, maximum: float, waits: list[float]
) -> None:
    backoff = Backoff(initial, maximum)
    assert [backoff.next() for _ in waits] == waits
    backoff.reset()
    assert [backoff.next() for _ in waits] == waits


@pytest.mark.parametrize(
    ("uniform", "low", "high"),
    [(0.0, 1.0, 1.0), (0.5, 1.5, 1.5), (0.999999, 1.9, 2.0)],
    ids=["lowest", "middle", "highest"],
)
def test_jitter_stretches_each_wait_within_its_bounds(uniform: float, low: float, high: float) -> None:
    backoff = Backoff(0.8, 30.0, jitter=1.0, uniform=lambda: uniform)
    for base in (0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0):
        wait = backoff.next()
        assert base * low <= wait <= base * high, (base, wait)
        assert wait < base * 2  # [1, 1 + jitter): never the whole doubling


def test_reset_after_starts_over_only_once_the_previous_wait_is_older_than_that() -> None:
    now = [0.0]
    backoff = Backoff(1.0, 8.0, reset_after=120.0, clock=lambda: now[0])
    assert [backoff.next() for _ in range(3)] == [1.0, 2.0, 4.0]
    now[0] += 120.0  # exactly that old: not yet
    assert backoff.next() == 8.0
    now[0] += 120.5
    assert [backoff.next() for _ in range(2)] == [1.0, 2.0]


def test_wait_waits_the_next_delay_unless_stopped() -> None:
    stop = threading.Event()
    backoff = Backoff(0.01, 1.0)
    assert backoff.wait(stop.wait) is False
    assert backoff.next() == 0.02  # the wait took the first delay
    stop.set()
    started = time.monotonic()
    assert Backoff(60.0, 60.0).wait(stop.wait) is True
    assert time.monotonic() - started < 5


def test_wait_returns_early_when_a_stop_comes_during_it() -> None:
    stop, waiting = threading.Event(), threading.Event()
    outcome: list[bool] = []

    def stop_wait(seconds: float) -> bool:
        waiting.set()
        return stop.wait(seconds)

    thread = threading.Thread(target=lambda: outcome.append(Backoff(60.0, 60.0).wait(stop_wait)))
    started = time.monotonic()
    thread.start()
    assert waiting.wait(5)
    stop.set()
    thread.join(5)
    assert outcome == [True] and time.monotonic() - started < 5
