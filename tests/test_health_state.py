"""The health state machine (nvdp.node.health.state) without threads or NVML: inputs and a clock value in,
health changes out. The monitor's loop is tested in test_health_monitor.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from nvdp.node.health import HealthSettings, XidPolicy
from nvdp.node.health.state import (
    GPU_LOST_REASON,
    RECOVERED_REASON,
    ROW_REMAP_FAILURE_REASON,
    GpuLost,
    HealthState,
    ProbeFailed,
    ProbeOutcome,
)
from nvdp.node.nvml.types import EventType, NvmlEvent, ProbeResult
from tests.builders import full_gpu, mig_device_info, mig_enabled_gpu

QUIET = 300.0
G0, G1, M = "GPU-0", "GPU-1", "GPU-M"  # M: MIG-enabled, two GPU instances with one CI each
MIG_A, MIG_B = "MIG-a", "MIG-b"


GPUS = [
    full_gpu(0, uuid=G0),
    full_gpu(1, uuid=G1),
    mig_enabled_gpu(
        2,
        mig_device_info(0, "3g.20gb", uuid=MIG_A, gi_id=1),
        mig_device_info(1, "3g.20gb", uuid=MIG_B, gi_id=2),
        uuid=M,
    ),
]


def xid(uuid: str, number: int, gi: int | None = None, ci: int | None = None) -> NvmlEvent:
    return NvmlEvent(uuid, EventType.XID_CRITICAL, number, gi, ci)


def dbe(uuid: str) -> NvmlEvent:
    return NvmlEvent(uuid, EventType.DOUBLE_BIT_ECC)


@dataclass(frozen=True)
class Lost:
    uuid: str


OK = ProbeResult()
Input = NvmlEvent | tuple[str, ProbeOutcome] | Lost  # an event, a probe (gpu, outcome), a lost GPU
Change = tuple[str, bool, bool, int | None]  # uuid, healthy, fatal, xid


def feed(state: HealthState, now: float, given: Input) -> list[Change]:
    if isinstance(given, NvmlEvent):
        changes = state.event(given, now)
    elif isinstance(given, Lost):
        changes = state.gpu_lost(given.uuid, now)
    else:
        changes = state.probed(given[0], given[1], now)
    assert all(c.since == now for c in changes)
    return [(c.uuid, c.healthy, c.fatal, c.xid) for c in changes]


@pytest.mark.parametrize(
    ("steps", "expected", "unhealthy"),
    [
        ([(1, xid(G0, 94))], [(G0, False, False, 94)], {G0: False}),
        ([(1, xid(G0, 13))], [], {}),
        ([(1, xid(G1, 79))], [(G1, False, True, 79)], {G1: True}),
        ([(1, dbe(G0))], [(G0, False, True, None)], {G0: True}),
        ([(1, xid("GPU-unknown", 79))], [], {}),
        (
            [(1, xid(M, 94))],
            [(M, False, False, 94), (MIG_A, False, False, 94), (MIG_B, False, False, 94)],
            {M: False, MIG_A: False, MIG_B: False},
        ),
        (
            [(1, xid(M, 94, gi=2, ci=0))],
            [(M, False, False, 94), (MIG_B, False, False, 94)],
            {M: False, MIG_B: False},
        ),
        (
            [(1, xid(M, 94, gi=7))],
            [(M, False, False, 94), (MIG_A, False, False, 94), (MIG_B, False, False, 94)],
            {M: False, MIG_A: False, MIG_B: False},
        ),
        ([(1, xid(MIG_A, 94))], [(M, False, False, 94), (MIG_A, False, False, 94)], {M: False, MIG_A: False}),
        ([(0, xid(G0, 94)), (QUIET, (G0, OK))], [(G0, False, False, 94), (G0, True, False, None)], {}),
        ([(0, xid(G0, 94)), (QUIET - 1, (G0, OK))], [(G0, False, False, 94)], {G0: False}),
        (
            [(0, xid(G0, 94)), (100, xid(G0, 94)), (QUIET, (G0, OK)), (QUIET + 100, (G0, OK))],
            [(G0, False, False, 94), (G0, True, False, None)],
            {},
        ),
        ([(0, xid(G0, 79)), (10 * QUIET, (G0, OK))], [(G0, False, True, 79)], {G0: True}),
        (
            [
                (0, xid(G0, 63)),
                (QUIET, (G0, ProbeResult(retired_pages_pending=True))),
                (QUIET, (G0, ProbeResult(row_remap_pending=True))),
            ],
            [(G0, False, False, 63)],
            {G0: False},
        ),
        (
            [(0, xid(G0, 94)), (QUIET, (G0, ProbeFailed("NVML_ERROR_UNKNOWN"))), (QUIET + 5, (G0, OK))],
            [(G0, False, False, 94), (G0, True, False, None)],
            {},
        ),
        (
            [(1, (M, GpuLost()))],
            [(M, False, True, None), (MIG_A, False, True, None), (MIG_B, False, True, None)],
            {M: True, MIG_A: True, MIG_B: True},
        ),
        ([(1, Lost(G1))], [(G1, False, True, None)], {G1: True}),
        ([(1, (G0, ProbeResult(row_remap_failure=True)))], [(G0, False, True, None)], {G0: True}),
        (
            [(0, xid(G0, 94)), (5, (G0, GpuLost())), (10 * QUIET, (G0, OK))],
            [(G0, False, False, 94)],
            {G0: True},
        ),
        (
            [(0, xid(G0, 94)), (5, xid(G0, 13)), (QUIET, (G0, OK))],
            [(G0, False, False, 94), (G0, True, False, None)],
            {},
        ),
    ],
    ids=[
        "critical-xid-marks-that-gpu",
        "application-xid-changes-nothing",
        "fatal-xid",
        "double-bit-ecc-follows-xid-48",
        "unmonitored-device",
        "mig-gpu-event-without-instance-marks-every-mig",
        "mig-event-by-instance-ids",
        "mig-event-for-unknown-instance-marks-the-whole-gpu",
        "event-on-a-mig-uuid-marks-it-and-its-gpu",
        "recovers-after-the-quiet-period",
        "no-recovery-within-the-quiet-period",
        "new-event-restarts-the-quiet-period",
        "fatal-never-recovers",
        "pending-retirement-or-remap-blocks-recovery",
        "failed-probe-tells-nothing-then-a-pass-recovers",
        "lost-gpu-marks-all-its-units-fatal",
        "lost-at-arming",
        "row-remap-failure-is-fatal",
        "lost-makes-a-marked-unit-fatal-without-a-new-change",
        "ignored-event-does-not-restart-the-quiet-period",
    ],
)
def test_transitions(
    steps: list[tuple[float, Input]], expected: list[Change], unhealthy: dict[str, bool]
) -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    got = [change for now, given in steps for change in feed(state, now, given)]
    assert got == expected
    assert state.unhealthy() == unhealthy


def test_reasons() -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    assert (
        state.event(xid(G0, 94), 0)[0].reason
        == "contained memory error (only the affected application was stopped)"
    )
    assert state.probed(G0, OK, QUIET)[0].reason == RECOVERED_REASON
    assert state.gpu_lost(G1, 1)[0].reason == GPU_LOST_REASON
    assert state.probed(M, ProbeResult(row_remap_failure=True), 1)[0].reason == ROW_REMAP_FAILURE_REASON


def test_zero_quiet_period_disables_recovery() -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), 0.0)
    state.event(xid(G0, 94), 0)
    assert state.probed(G0, OK, 1e9) == []
    assert state.unhealthy() == {G0: False}


def test_new_rules_apply_to_later_inputs_and_keep_states() -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    state.event(xid(G0, 94), 0)
    state.set_rules(XidPolicy.from_env({}, HealthSettings(ignored_xids=frozenset({94}))), 10.0)
    assert state.event(xid(G1, 94), 1) == []
    assert [(c.uuid, c.healthy) for c in state.probed(G0, OK, 10)] == [(G0, True)]


def test_new_enumeration_keeps_known_units() -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    state.event(xid(G0, 79), 0)
    state.event(xid(G1, 94), 0)
    state.set_gpus([GPUS[0], full_gpu(3)])
    assert state.unhealthy() == {G0: True}
    assert [g.uuid for g in state.gpus] == [G0, "GPU-3"]
    assert state.event(xid(G1, 94), 1) == []  # no longer monitored


def test_units_gone_in_between_start_afresh() -> None:
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    state.event(xid(G0, 79), 0)
    state.event(xid(G1, 79), 0)
    state.set_gpus(GPUS, forget={G1})  # G1 left an enumeration the state never took, and came back
    assert state.unhealthy() == {G0: True}
    assert [(c.uuid, c.healthy) for c in state.gpu_lost(G1, 1)] == [(G1, False)]  # marked again


def test_probe_failures_are_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.health.state")
    state = HealthState(GPUS, XidPolicy.from_env({}), QUIET)
    for outcome in (ProbeFailed("NVML_ERROR_UNKNOWN"), ProbeFailed("NVML_ERROR_UNKNOWN"), OK, OK):
        state.probed(G1, outcome, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "health probe failed; no recovery until it passes",
        "health probe answers again",
    ]
