"""`--configmap-spread`: a ConfigMap edit heard through the API waits a random delay, bounded, so that a
fleet's config-managers do not apply it (and reload, re-register, write Events) in the same second."""

from __future__ import annotations

import argparse
import threading
import time

import pytest

from nvdp.base.errors import ConfigError
from nvdp.side.configmanager.settings import add_flags, resolve
from nvdp.side.configmanager.spread import Spread
from testkit import wait_until

DELAY_S = 0.3  # the test's bound (production: 10 s)


class Applied:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, float]] = []
        self.lock = threading.Lock()

    def __call__(self, data: str, listed: bool) -> None:
        with self.lock:
            self.calls.append((data, listed, time.monotonic()))

    def data(self) -> list[str]:
        with self.lock:
            return [c[0] for c in self.calls]


def test_the_first_state_applies_at_once_and_a_change_after_its_random_delay() -> None:
    applied = Applied()
    spread = Spread(applied, DELAY_S, random_fraction=lambda: 1.0)  # the longest delay drawn
    spread("listed", True)
    assert applied.data() == ["listed"]
    heard = time.monotonic()
    spread("edit 1", False)
    spread("edit 2", False)  # replaces the one waiting, which keeps its delay
    assert applied.data() == ["listed"]
    wait_until(lambda: len(applied.data()) == 2, 5.0, "the edit applied")
    assert applied.calls[1][:2] == ("edit 2", False)
    assert applied.calls[1][2] - heard >= DELAY_S
    time.sleep(DELAY_S)  # nothing else is pending
    assert applied.data() == ["listed", "edit 2"]


@pytest.mark.parametrize(
    ("fraction", "bound"), [(0.0, 0.0), (0.5, DELAY_S / 2)], ids=["drawn 0", "drawn half"]
)
def test_the_delay_is_the_drawn_fraction_of_the_bound(fraction: float, bound: float) -> None:
    applied = Applied()
    spread = Spread(applied, DELAY_S, random_fraction=lambda: fraction)
    spread("listed", True)
    heard = time.monotonic()
    spread("edit", False)
    wait_until(lambda: len(applied.data()) == 2, 5.0, "the edit applied")
    assert bound <= applied.calls[1][2] - heard < bound + DELAY_S


def test_no_spread_applies_every_change_at_once_and_close_drops_a_waiting_one() -> None:
    at_once = Applied()
    spread = Spread(at_once, 0.0)
    for n in range(3):
        spread(f"state {n}", n == 0)
    assert at_once.data() == ["state 0", "state 1", "state 2"]
    waiting = Applied()
    spread = Spread(waiting, DELAY_S, random_fraction=lambda: 1.0)
    spread("listed", True)
    spread("edit", False)
    spread.close()
    spread("after close", False)
    time.sleep(DELAY_S * 2)
    assert waiting.data() == ["listed"]


def _spread_of(argv: list[str], environ: dict[str, str]) -> float:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    base = {"NODE_NAME": "node-a", "CONFIG_FILE_SRCDIR": "/src", "CONFIG_FILE_DST": "/dst"}
    return resolve(parser.parse_args(argv), base | environ, "/nonexistent").configmap_spread


@pytest.mark.parametrize(
    ("argv", "environ", "seconds"),
    [([], {}, 10.0), (["--configmap-spread", "1m"], {}, 60.0), ([], {"NVDP_CONFIGMAP_SPREAD": "0"}, 0.0)],
    ids=["default", "flag", "env, off"],
)
def test_the_spread_setting(argv: list[str], environ: dict[str, str], seconds: float) -> None:
    assert _spread_of(argv, environ) == seconds


def test_a_negative_spread_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        _spread_of([], {"NVDP_CONFIGMAP_SPREAD": "-1s"})
    assert str(refused.value) == 'NVDP_CONFIGMAP_SPREAD: must be >= 0, got "-1s"'
