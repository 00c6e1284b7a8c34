"""HealthRouter: replicas follow their uuid, one set_health per target per batch, exact log lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from nvdp.base.logs import JsonFormatter, TextFormatter
from nvdp.base.units import format_go_duration
from nvdp.node.health import HealthChange, HealthRouter
from tests.builders import device, full_gpu, mig_device_info, replicas
from tests.fakes import FakeTarget

GPU0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-0000-0000-000000000001"
MIG = "MIG-cccccccc-0000-0000-0000-000000000002"
FIRST, SECOND = full_gpu(0, uuid=GPU0), full_gpu(1, uuid=GPU1)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger = logging.getLogger("nvdp.node.health.router")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(old)


def down(
    uuid: str, xid: int | None = 79, reason: str = "GPU has fallen off the bus", since: float = 0.0
) -> HealthChange:
    return HealthChange(uuid, False, reason, xid, xid == 79, since)


def up(uuid: str, since: float) -> HealthChange:
    return HealthChange(uuid, True, "recovered", None, False, since)


def test_replicas_follow_and_one_call_per_target() -> None:
    shared = FakeTarget("nvidia.com/gpu", [*replicas(FIRST, 4), *replicas(SECOND, 1)])
    whole = FakeTarget("nvidia.com/gpu.whole", [device(FIRST), device(SECOND)])
    other = FakeTarget("nvidia.com/mig-1g.5gb", [device(SECOND, mig_device_info(0, uuid=MIG))])
    router = HealthRouter([shared, whole, other])
    router.handle([down(GPU0), down(GPU1)])
    assert shared.calls == [(sorted([f"{GPU0}::{r}" for r in range(4)] + [f"{GPU1}::0"]), False)]
    assert whole.calls == [([GPU0, GPU1], False)]
    assert other.calls == []
    router.handle([down(GPU0)])  # already unhealthy: no call
    assert len(whole.calls) == 1
    router.handle([up(GPU0, 1.0)])
    assert whole.calls[-1] == ([GPU0], True)


def test_set_targets_reapplies_unhealthy() -> None:
    router = HealthRouter([FakeTarget("nvidia.com/gpu", [device(FIRST), device(SECOND)])])
    router.handle([down(GPU1)])
    reloaded = FakeTarget(
        "nvidia.com/gpu",
        [*replicas(FIRST, 2), *replicas(SECOND, 2)],
    )
    router.set_targets([reloaded])
    assert reloaded.calls == [([f"{GPU1}::0", f"{GPU1}::1"], False)]
    router.handle([up(GPU1, 3.0)])
    assert reloaded.calls[-1] == ([f"{GPU1}::0", f"{GPU1}::1"], True)
    assert router.unhealthy() == {}


def test_a_device_gone_from_the_node_forgets_its_health(records: list[logging.LogRecord]) -> None:
    """Present devices keep Unhealthy across reloads; one that left the enumeration comes back Healthy
    (a new device), and a held change of a gone device is dropped."""
    router = HealthRouter([FakeTarget("nvidia.com/gpu", [device(FIRST), device(SECOND)])])
    router.handle([down(GPU0), down(GPU1), down(MIG)])  # MIG: no target holds it, held
    router.forget([GPU1, MIG])
    assert set(router.unhealthy()) == {GPU0}
    back = FakeTarget("nvidia.com/gpu", [device(FIRST), device(SECOND)])
    mig = FakeTarget("nvidia.com/mig-1g.5gb", [device(SECOND, mig_device_info(0, uuid=MIG))])
    router.set_targets([back, mig])
    assert back.calls == [([GPU0], False)] and mig.calls == []
    assert records[-1].getMessage() == "kept devices unhealthy across reload"
    assert [r.getMessage() for r in records].count("forgot the health of devices gone from the node") == 1


def test_log_lines_text_and_json(records: list[logging.LogRecord]) -> None:
    target = FakeTarget("nvidia.com/gpu", replicas(full_gpu(3, uuid=GPU0), 2))
    router = HealthRouter([target])
    router.handle([down(GPU0, since=10.0)])
    router.handle([up(GPU0, since=310.0)])
    assert len(records) == 2  # one per transition per resource, not per replica
    text = [TextFormatter().format(r).split(" ", 1)[1] for r in records]
    assert text == [
        f"WARNING device unhealthy resource=nvidia.com/gpu device={GPU0} index=3 xid=79 "
        f'reason="GPU has fallen off the bus" fatal=true',
        f"INFO    device healthy resource=nvidia.com/gpu device={GPU0} index=3 after=5m0s",
    ]
    as_json = [json.loads(JsonFormatter().format(r)) for r in records]
    assert {k: v for k, v in as_json[0].items() if k != "time"} == {
        "level": "warning",
        "logger": "nvdp.node.health.router",
        "msg": "device unhealthy",
        "resource": "nvidia.com/gpu",
        "device": GPU0,
        "index": "3",
        "xid": 79,
        "reason": "GPU has fallen off the bus",
        "fatal": True,
    }
    assert as_json[1]["after"] == "5m0s"


def test_log_line_without_xid(records: list[logging.LogRecord]) -> None:
    router = HealthRouter([FakeTarget("nvidia.com/gpu", [device(FIRST)])])
    router.handle([HealthChange(GPU0, False, "GPU is lost (NVML_ERROR_GPU_IS_LOST)", None, True, 0.0)])
    line = TextFormatter().format(records[0]).split(" ", 1)[1]
    assert line == (
        f"WARNING device unhealthy resource=nvidia.com/gpu device={GPU0} index=0 "
        f'reason="GPU is lost (NVML_ERROR_GPU_IS_LOST)" fatal=true'
    )


def test_text_formatter_through_a_stream() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("nvdp.node.health.router")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        HealthRouter([FakeTarget("nvidia.com/gpu", [device(FIRST)])]).handle([down(GPU0)])
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().rstrip().endswith('reason="GPU has fallen off the bus" fatal=true')


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (1.5, "1.5s"),
        (59, "59s"),
        (300, "5m0s"),
        (90.5, "1m30.5s"),
        (7200, "2h0m0s"),
        (3725.125, "1h2m5.125s"),
    ],
    ids=lambda v: str(v),
)
def test_go_duration(seconds: float, text: str) -> None:
    """How the router prints how long a device was in its last state: Go's form, to the millisecond."""
    assert format_go_duration(round(seconds, 3)) == text
