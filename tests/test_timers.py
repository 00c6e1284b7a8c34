"""The timers tests shorten (`nvdp.base.timers`): production's defaults, the hidden NVDP_TEST_TIMERS env
var read by every `nvdp` process, and its bad values refused with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvdp.base.errors import ConfigError
from nvdp.base.timers import ENV, Timers, as_env, parse
from testkit import clean_env


def test_the_defaults_are_productions() -> None:
    assert Timers() == Timers(
        stop_deadline=10.0,
        request_deadline=3.0,
        handoff_retry=5.0,
        handoff_switch_grace=30.0,
        handoff_lost_grace=30.0,
        node_condition_settle=3.0,
        node_condition_pacing=1.0,
        watch_backoff=0.8,
        mps_quit_timeout=3.0,
    )
    assert parse("") == Timers()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("stopDeadline=1.5", Timers(stop_deadline=1.5), id="seconds"),
        pytest.param(
            "handoffRetry=200ms, watchBackoff=0", Timers(handoff_retry=0.2, watch_backoff=0.0), id="go"
        ),
        pytest.param("requestDeadline=1m,", Timers(request_deadline=60.0), id="trailing-comma"),
    ],
)
def test_a_setting_shortens_its_timer_only(text: str, expected: Timers) -> None:
    assert parse(text) == expected


def test_as_env_is_what_parse_reads() -> None:
    env = as_env(handoff_lost_grace=2.0, mps_quit_timeout=0.5)
    assert env == {ENV: "handoffLostGrace=2,mpsQuitTimeout=0.5"}
    assert parse(env[ENV]) == Timers(handoff_lost_grace=2.0, mps_quit_timeout=0.5)


NAMES = (
    "handoffLostGrace, handoffRetry, handoffSwitchGrace, mpsQuitTimeout, nodeConditionPacing,"
    " nodeConditionSettle, requestDeadline, stopDeadline, watchBackoff"
)
NOT_A_DURATION = "must be a duration >= 0 such as 500ms or 0.5, got"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("stop=1", f"'stop=1' is not name=duration with a name of {NAMES}", id="name"),
        pytest.param(
            "stopDeadline", f"'stopDeadline' is not name=duration with a name of {NAMES}", id="no-value"
        ),
        pytest.param("stopDeadline=-1s", f"stopDeadline: {NOT_A_DURATION} '-1s'", id="negative"),
        pytest.param("watchBackoff=soon", f"watchBackoff: {NOT_A_DURATION} 'soon'", id="word"),
    ],
)
def test_a_bad_value_is_one_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert str(caught.value) == f"NVDP_TEST_TIMERS: {error}"


def test_nvdp_refuses_a_bad_value_at_start_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "gfd", "--oneshot", "--nvml", "sim:pcie-4"],
        env=clean_env({ENV: "stopDeadline=x"}),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (1, "")
    expected = (
        "error: NVDP_TEST_TIMERS: stopDeadline: must be a duration >= 0 such as 500ms or 0.5, got 'x'\n"
    )
    assert done.stderr == expected
