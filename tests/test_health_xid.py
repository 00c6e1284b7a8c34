"""XID policy: NVIDIA's env var rules, the config's ignore/fatal lists, event classification."""

from __future__ import annotations

import pytest

from nvdp.node.health import DEFAULT_FATAL_XIDS, HealthSettings, XidPolicy
from nvdp.node.health.xid import xid_reason
from nvdp.node.nvml.types import EventType, NvmlEvent

GPU = "GPU-00000000-0000-0000-0000-000000000000"


def xid_event(xid: int) -> NvmlEvent:
    return NvmlEvent(GPU, EventType.XID_CRITICAL, xid)


# (disable env, enable env, xid, marks the device)
ENV_CASES = [
    ("", "", 79, True),
    ("", "", 13, False),
    ("", "", 31, False),
    ("", "", 43, False),
    ("", "", 45, False),
    ("", "", 68, False),
    ("", "", 109, False),
    ("", "", 555, True),
    ("all", "", 79, False),
    ("xids", "", 79, False),
    ("XIDS", "", 48, False),
    ("68,all", "", 79, False),
    ("11", "", 11, False),
    ("11", "", 12, True),
    (" 11 , 12,", "", 12, False),
    ("-68,not-an-int,67", "", 67, False),
    ("-68,not-an-int,67", "", 66, True),
    ("11", "11", 11, True),
    ("", "31", 31, True),
    ("", "31", 13, False),
    ("", "all", 13, True),
    ("", "all", 109, True),
    ("all", "all", 555, True),
    ("all", "48", 48, True),
    ("all", "48", 79, False),
]


@pytest.mark.parametrize(
    ("disable", "enable", "xid", "marks"),
    ENV_CASES,
    ids=[f"disable={d or '-'} enable={e or '-'} xid={x}" for d, e, x, _ in ENV_CASES],
)
def test_env_rules(disable: str, enable: str, xid: int, marks: bool) -> None:
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": disable, "DP_ENABLE_HEALTHCHECKS": enable})
    assert policy.classify(xid_event(xid)).marks_unhealthy is marks


@pytest.mark.parametrize(
    ("env", "enabled", "events", "probe"),
    [
        ({}, True, True, True),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, False, False, False),
        ({"DP_DISABLE_HEALTHCHECKS": "xids"}, True, False, True),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, True, True, False),
        ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"}, True, True, True),
        ({"DP_DISABLE_HEALTHCHECKS": "13,79"}, True, True, True),
    ],
    ids=["default", "all-off", "xids-off-probe-on", "all-but-79", "all-then-all", "list"],
)
def test_what_runs(env: dict[str, str], enabled: bool, events: bool, probe: bool) -> None:
    policy = XidPolicy.from_env(env)
    assert (policy.enabled, policy.events_enabled, policy.probe) == (enabled, events, probe)


@pytest.mark.parametrize(
    ("env", "settings", "xid", "marks", "fatal"),
    [
        ({}, HealthSettings(ignored_xids=frozenset({94})), 94, False, False),
        ({"DP_ENABLE_HEALTHCHECKS": "94"}, HealthSettings(ignored_xids=frozenset({94})), 94, True, False),
        ({}, HealthSettings(), 94, True, False),
        ({}, HealthSettings(), 95, True, True),
        ({}, HealthSettings(fatal_xids=frozenset({94})), 94, True, True),
        ({}, HealthSettings(fatal_xids=frozenset({94})), 79, True, False),
        ({}, HealthSettings(fatal_xids=frozenset({13})), 13, False, True),
    ],
    ids=[
        "config-ignore",
        "env-enable-beats-config-ignore",
        "contained-ecc-recoverable",
        "uncontained-ecc-fatal",
        "config-fatal-replaces-default",
        "default-fatal-replaced",
        "ignored-stays-ignored-when-fatal",
    ],
)
def test_config(env: dict[str, str], settings: HealthSettings, xid: int, marks: bool, fatal: bool) -> None:
    verdict = XidPolicy.from_env(env, settings).classify(xid_event(xid))
    assert (verdict.marks_unhealthy, verdict.fatal) == (marks, fatal)


@pytest.mark.parametrize(
    ("xid", "fatal"),
    [(79, True), (48, True), (64, True), (74, True), (95, True), (119, True), (120, True), (140, True)]
    + [(63, False), (92, False), (94, False), (121, False), (61, False), (69, False)],
    ids=lambda v: str(v),
)
def test_default_fatal_set(xid: int, fatal: bool) -> None:
    assert (xid in DEFAULT_FATAL_XIDS) is fatal
    assert XidPolicy().classify(xid_event(xid)).fatal is fatal


def test_reasons() -> None:
    assert xid_reason(79) == "GPU has fallen off the bus"
    assert "12345" in xid_reason(12345)


@pytest.mark.parametrize(
    ("event_type", "env", "sbe", "marks", "fatal"),
    [
        (EventType.DOUBLE_BIT_ECC, {}, False, True, True),
        (EventType.DOUBLE_BIT_ECC, {"DP_DISABLE_HEALTHCHECKS": "48"}, False, False, True),
        (EventType.DOUBLE_BIT_ECC, {"DP_DISABLE_HEALTHCHECKS": "xids"}, False, False, True),
        (EventType.SINGLE_BIT_ECC, {}, False, False, False),
        (EventType.SINGLE_BIT_ECC, {}, True, True, False),
        (EventType.SINGLE_BIT_ECC, {"DP_DISABLE_HEALTHCHECKS": "xids"}, True, False, False),
        (EventType.PSTATE, {}, True, False, False),
    ],
    ids=["dbe", "dbe-follows-48", "dbe-xids-off", "sbe-off", "sbe-on", "sbe-xids-off", "pstate"],
)
def test_ecc_events(event_type: EventType, env: dict[str, str], sbe: bool, marks: bool, fatal: bool) -> None:
    policy = XidPolicy.from_env(env, HealthSettings(single_bit_ecc=sbe))
    verdict = policy.classify(NvmlEvent(GPU, event_type))
    assert (verdict.marks_unhealthy, verdict.fatal) == (marks, fatal)


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="probe_interval"):
        HealthSettings(probe_interval=0)
    with pytest.raises(ValueError, match="recovery_quiet_period"):
        HealthSettings(recovery_quiet_period=-1)
