"""Health transitions that name the pods hit: the router's log line and Node event name the holders
the ledger knows, each pod gets one event of its own (what `kubectl describe pod` shows), and the
events of one subject are bounded per window; the pod events go to the API server off the health
path, through the real `kubernetes` client against the API stand-in."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import pytest

from nvdp.kube import Involved, KubeEvents
from nvdp.node.gpus.devices import Device
from nvdp.node.health import HealthChange, HealthRouter
from nvdp.node.health.event_budget import EventBudget
from nvdp.node.health.event_sender import Event
from nvdp.node.health.pod_events import PodEventRecorder, pod_events, pod_events_from_env
from nvdp.plugins.ledger.types import Holding
from tests.builders import device, full_gpu, mig_device_info, mig_enabled_gpu, replicas
from tests.fakes import FakeEventSink, FakeTarget
from tests.kube_api_standin import KubeApiStandin
from tests.readings import log_lines

GPU = "nvidia.com/gpu"
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
FATAL = HealthChange(UUID, False, "GPU has fallen off the bus", 79, True, 10.0)
CONTAINED = HealthChange(UUID, False, "contained ECC error", 94, False, 10.0)


class Ledger:
    """The allocation lookup the router asks (`AllocationLookup`): fixed holdings, reads asked counted."""

    def __init__(self, *holdings: Holding) -> None:
        self.holdings = list(holdings)
        self.reads_asked = 0

    def held(self, resource: str, device_ids: Collection[str]) -> list[Holding]:
        return [h for i in device_ids for h in self.holdings if (h.resource, h.device_id) == (resource, i)]

    def changed(self) -> None:
        self.reads_asked += 1


class PodSink:
    """Where the router hands the pods hit (`PodEventSink`)."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, list[str], HealthChange, list[Holding]]] = []

    def record(
        self,
        resource: str,
        devices: Sequence[Device],
        change: HealthChange,
        before: HealthChange | None,
        holders: Sequence[Holding],
    ) -> None:
        self.recorded.append((resource, [d.id for d in devices], change, list(holders)))


def test_the_log_line_and_node_event_name_the_pods_holding_the_gpu(caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTarget(GPU, replicas(full_gpu(3, uuid=UUID), 3))
    ledger = Ledger(
        Holding(GPU, f"{UUID}::2", "ml", "b", "main"), Holding(GPU, f"{UUID}::0", "ml", "a", "main")
    )
    node, pods = FakeEventSink(), PodSink()
    router = HealthRouter([target], node_events=node, allocations=ledger, pod_events=pods)
    caplog.set_level(logging.INFO, logger="nvdp.node.health.router")
    router.handle([FATAL])
    line = (
        f'device unhealthy resource={GPU} device={UUID} index=3 xid=79 reason="GPU has fallen off the bus" '
        "fatal=true pods=ml/a,ml/b"
    )
    assert log_lines(caplog) == [line]
    assert node.recorded == [("Warning", "GPUUnhealthy", line)]
    assert pods.recorded == [
        (GPU, [f"{UUID}::{n}" for n in range(3)], FATAL, [ledger.holdings[1], ledger.holdings[0]])
    ]
    assert ledger.reads_asked == 1  # the record is read again after the change


def test_no_holders_no_pods_field_and_no_pod_events(caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTarget(GPU, [device(full_gpu(3, uuid=UUID))])
    pods = PodSink()
    router = HealthRouter([target], allocations=Ledger(), pod_events=pods)
    caplog.set_level(logging.INFO, logger="nvdp.node.health.router")
    router.handle([FATAL])
    assert log_lines(caplog)[0].endswith("fatal=true")
    assert pods.recorded == []


def test_node_events_of_a_flapping_gpu_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTarget(GPU, [device(full_gpu(3, uuid=UUID))])
    node = FakeEventSink()
    router = HealthRouter([target], node_events=node, event_budget=EventBudget(4, 600.0))
    caplog.set_level(logging.INFO)
    for n in range(100):
        router.handle([HealthChange(UUID, n % 2 == 1, "contained ECC error", 94, False, float(n))])
    assert [reason for _, reason, _ in node.recorded] == ["GPUUnhealthy", "GPUHealthy"] * 2
    assert len([r for r in log_lines(caplog) if r.startswith("device ")]) == 100  # every one logged
    assert [line for line in log_lines(caplog) if "left out" in line] == [
        f'events left out: too many for one subject subject="node events of {GPU} device {UUID}" limit=4 '
        "window=10m0s"
    ]


def test_the_budget_is_per_subject_and_per_window() -> None:
    now = [0.0]
    budget = EventBudget(2, 60.0, clock=lambda: now[0])
    assert [budget.allow("a", "a") for _ in range(3)] == [True, True, False]
    assert budget.allow("b", "b")  # another subject has its own
    now[0] = 61.0
    assert budget.allow("a", "a")
    assert budget.suppressed == 1


def holding(pod: str, device_id: str, container: str = "main", uid: str | None = None) -> Holding:
    return Holding(GPU, device_id, "ml", pod, container, uid)


def test_one_event_per_pod_says_gpu_xid_since_and_outlook() -> None:
    devices = replicas(full_gpu(3, uuid=UUID), 4)
    holders = [
        holding("a", f"{UUID}::0", uid="uid-a"),
        holding("a", f"{UUID}::1", "aux", uid="uid-a"),
        holding("b", f"{UUID}::3"),
    ]
    events = pod_events(GPU, devices, CONTAINED, None, holders, recovery_quiet_period=300.0, now=NOW)
    outlook = (
        "nvdp expects it to recover: Healthy again once 5m0s pass without a new error and a probe of the "
        "GPU passes."
    )
    assert events == [
        Event(
            Involved.pod("ml", "a", "uid-a"), "Warning", "GPUUnhealthy",
            f"GPU 3 ({UUID}) is unhealthy since 2026-01-01T00:00:00Z: XID 94, contained ECC error. This pod "
            f"holds {GPU} {UUID}::0, {UUID}::1 on it (container main, aux). {outlook}",
        ),
        Event(
            Involved.pod("ml", "b", None, "main"), "Warning", "GPUUnhealthy",
            f"GPU 3 ({UUID}) is unhealthy since 2026-01-01T00:00:00Z: XID 94, contained ECC error. This pod "
            f"holds {GPU} {UUID}::3 on it (container main). {outlook}",
        ),
    ]  # fmt: skip
    off = pod_events(GPU, devices, CONTAINED, None, holders[2:], recovery_quiet_period=0.0, now=NOW)
    assert off[0].message.endswith(
        "Recovery is off (health.recoveryQuietPeriod 0): it stays Unhealthy until the device plugin restarts."
    )
    back = HealthChange(UUID, True, "recovered", None, False, 70.0)
    (healthy,) = pod_events(GPU, devices, back, CONTAINED, holders[2:], recovery_quiet_period=300.0, now=NOW)
    assert (healthy.event_type, healthy.reason) == ("Normal", "GPUHealthy")
    assert healthy.message == (
        f"GPU 3 ({UUID}) is healthy again since 2026-01-01T00:00:00Z, after 1m0s unhealthy (XID 94, "
        f"contained ECC error). This pod holds {GPU} {UUID}::3 on it (container main)."
    )


def test_a_mig_device_is_named_with_its_gpu() -> None:
    gpu = mig_enabled_gpu(1, mig_device_info(0, "3g.20gb"), uuid="GPU-m")
    mig = gpu.mig_devices[0]
    change = HealthChange(mig.uuid, False, "double-bit ECC error", None, True, 1.0)
    (event,) = pod_events(
        "nvidia.com/mig-3g.20gb", [device(gpu, mig)], change, None, [holding("a", mig.uuid)],
        recovery_quiet_period=300.0, now=NOW,
    )  # fmt: skip
    assert event.message.startswith(
        f"MIG device 1:0 ({mig.uuid}) on GPU 1 (GPU-m) is unhealthy since 2026-01-01T00:00:00Z: double-bit "
        "ECC error. This pod holds nvidia.com/mig-3g.20gb"
    )


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        yield standin


def recorder(api: KubeApiStandin, **options: object) -> PodEventRecorder:
    return PodEventRecorder(
        lambda: KubeEvents("gpu-node-1", host=api.url, token="t"),
        recovery_quiet_period=lambda: 300.0,
        clock=lambda: NOW,
        **options,  # type: ignore[arg-type]
    )


def test_pod_events_are_posted_in_the_pods_namespace(api: KubeApiStandin) -> None:
    events = recorder(api)
    devices = replicas(full_gpu(3, uuid=UUID), 2)
    events.record(
        GPU, devices, FATAL, None, [holding("a", f"{UUID}::0", uid="uid-a"), holding("b", f"{UUID}::1")]
    )
    assert events.join(20)
    events.close()
    (a,), (b,) = api.events("Pod", "a", "ml"), api.events("Pod", "b", "ml")
    assert a["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "a", "uid": "uid-a",
        "fieldPath": "spec.containers{main}",
    }  # fmt: skip
    assert "uid" not in b["involvedObject"]  # unknown: listed by `kubectl get events`, not by describe
    assert a["metadata"]["namespace"] == "ml" and a["metadata"]["name"].startswith("a.")
    assert a["source"] == {"component": "nvidia-device-plugin", "host": "gpu-node-1"}
    assert (a["type"], a["reason"], a["count"]) == ("Warning", "GPUUnhealthy", 1)
    assert [path for method, path, _ in api.requests if method == "POST"] == [
        "/api/v1/namespaces/ml/events"
    ] * 2
    assert events.sent == 2


def test_a_failing_api_server_is_one_warning_per_event_and_health_goes_on(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail(403, count=1)
    events = recorder(api)
    caplog.set_level(logging.WARNING, logger="nvdp.node.health.pod_events")
    events.record(GPU, [device(full_gpu(3, uuid=UUID))], FATAL, None, [holding("a", UUID)])
    assert events.join(20)
    events.close()
    assert events.failed == 1 and events.sent == 0
    (line,) = log_lines(caplog)
    assert line.startswith(
        'pod event not recorded pod=ml/a reason=GPUUnhealthy error="cannot create event on pod ml/a:'
    )


def test_each_pods_events_about_one_gpu_are_bounded(api: KubeApiStandin) -> None:
    events = recorder(api, budget=EventBudget(2, 600.0))
    target = [device(full_gpu(3, uuid=UUID))]
    for n in range(10):
        change = HealthChange(UUID, n % 2 == 1, "contained ECC error", 94, False, float(n))
        events.record(GPU, target, change, None, [holding("a", UUID), holding("b", UUID, "main")])
    assert events.join(20)
    events.close()
    assert [len(api.events("Pod", p, "ml")) for p in ("a", "b")] == [2, 2]


def test_from_env(tmp_path: Path, api: KubeApiStandin) -> None:
    quiet = lambda: 300.0  # noqa: E731
    assert pod_events_from_env({}, recovery_quiet_period=quiet) is None  # no node name
    assert (
        pod_events_from_env({"NODE_NAME": "n"}, recovery_quiet_period=quiet, token_file=str(tmp_path / "t"))
        is None
    )
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    events = pod_events_from_env({"NODE_NAME": "n"}, recovery_quiet_period=quiet, kubeconfig=kubeconfig)
    assert events is not None
    events.record(GPU, [device(full_gpu(3, uuid=UUID))], FATAL, None, [holding("a", UUID)])
    assert events.join(30)
    events.close()
    assert api.events("Pod", "a", "ml")[0]["source"]["host"] == "n"
