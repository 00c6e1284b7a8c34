"""The GPU health condition and taint on the Node: what the Node should say (pure), and the reporter
that writes it through nvdp.kube (its own transport here) to the API stand-in: idempotent, rate-limited,
retried, never in the health path's way."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.backoff import Backoff
from nvdp.config import parse
from nvdp.kube import KubeNodeStatus, new_api_client
from nvdp.node.health.condition import (
    CONDITION_TYPE,
    MAX_NAMED,
    TAINT_KEY,
    GpuHealthCondition,
    condition_body,
    gpu_health_condition,
    taints_with,
)
from nvdp.node.health.node_condition import NodeConditionReporter, node_condition_from_env
from nvdp.node.health.settings import health_settings
from nvdp.node.health.state import GPU_LOST_REASON, HealthState
from nvdp.node.health.types import HealthChange, HealthSettings
from nvdp.node.health.xid import XidPolicy
from nvdp.node.nvml.types import EventType, NvmlEvent, ProbeResult
from testkit import REPO, wait_until
from tests.builders import full_gpu, mig_enabled_gpu
from tests.fakes import FakeNodeHealthView
from tests.kube_api_standin import KubeApiStandin

NODE = "gpu-node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
GPUS = [full_gpu(0), full_gpu(1)]
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
}
EARLIER = "2024-01-01T00:00:00Z"


def xid_fault(uuid: str, number: int, fatal: bool) -> HealthChange:
    return HealthChange(uuid, False, f"reason of XID {number}", number, fatal, 1.0)


def lost(uuid: str) -> HealthChange:
    return HealthChange(uuid, False, GPU_LOST_REASON, None, True, 1.0)


# ---- what the Node should say ------------------------------------------------------------------


def test_a_fatal_xid_turns_the_condition_false_naming_the_gpu() -> None:
    said = gpu_health_condition(GPUS, {"GPU-1": xid_fault("GPU-1", 79, True)})
    assert said == GpuHealthCondition(
        "False",
        "FatalXid",
        "1 of 2 GPUs have a fatal fault, kept until a GPU reset or a reboot: "
        "GPU 1 GPU-1: XID 79 (reason of XID 79)",
    )


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lost("GPU-0"), id="lost"),
        pytest.param(HealthChange("GPU-0", False, "GPU enumeration failed: x", None, True), id="enumeration"),
    ],
)
def test_a_lost_gpu_is_the_reason_before_a_fatal_xid(fault: HealthChange) -> None:
    said = gpu_health_condition(GPUS, {"GPU-0": fault, "GPU-1": xid_fault("GPU-1", 48, True)})
    assert (said.status, said.reason) == ("False", "GpuLost")
    assert said.message.endswith(f"GPU 0 GPU-0: {fault.reason}; GPU 1 GPU-1: XID 48 (reason of XID 48)")


def test_faults_that_recover_by_themselves_leave_it_true() -> None:
    faults = {g.uuid: xid_fault(g.uuid, 94, False) for g in GPUS}
    said = gpu_health_condition(GPUS, faults)
    assert said == GpuHealthCondition("True", "GpusHealthy", "2 GPUs healthy")


def test_false_stays_until_every_gpu_is_healthy() -> None:
    before = gpu_health_condition(GPUS, {"GPU-0": xid_fault("GPU-0", 79, True)})
    still = gpu_health_condition(GPUS, {"GPU-1": xid_fault("GPU-1", 94, False)}, before=before)
    assert still == before
    assert gpu_health_condition(GPUS, {}, before=still).status == "True"


def test_a_failing_monitor_is_unknown_unless_a_fatal_fault_is_known() -> None:
    failing = "health monitor degraded for 5m0s (over ...)"
    said = gpu_health_condition(GPUS, {}, monitor_failing=failing)
    assert said == GpuHealthCondition("Unknown", "MonitorDegraded", failing)
    assert gpu_health_condition(GPUS, {"GPU-0": lost("GPU-0")}, monitor_failing=failing).status == "False"


def test_the_taint_only_when_asked_and_no_gpu_is_left_healthy() -> None:
    one_down = {"GPU-0": lost("GPU-0")}
    all_down = {**one_down, "GPU-1": xid_fault("GPU-1", 94, False)}
    assert gpu_health_condition(GPUS, one_down, taint=True).taint is None
    assert gpu_health_condition(GPUS, all_down, taint=False).taint is None
    assert gpu_health_condition(GPUS, all_down, taint=True).taint == "GpuLost"


def test_a_gpu_with_a_healthy_mig_device_is_left_healthy() -> None:
    gpu = mig_enabled_gpu(0, "1g.5gb", "1g.5gb")
    first, second = (m.uuid for m in gpu.mig_devices)
    one_mig = {gpu.uuid: xid_fault(gpu.uuid, 95, True), first: xid_fault(first, 95, True)}
    said = gpu_health_condition([gpu], one_mig, taint=True)
    assert (said.status, said.taint) == ("False", None)
    every_mig = {**one_mig, second: xid_fault(second, 95, True)}
    assert gpu_health_condition([gpu], every_mig, taint=True).taint == "FatalXid"


def test_the_message_names_a_few_gpus_and_counts_the_others() -> None:
    gpus = [full_gpu(n) for n in range(MAX_NAMED + 3)]
    said = gpu_health_condition(gpus, {g.uuid: lost(g.uuid) for g in gpus})
    assert said.message.startswith(f"{MAX_NAMED + 3} of {MAX_NAMED + 3} GPUs have a fatal fault")
    assert said.message.count("GPU-") == MAX_NAMED and said.message.endswith("; and 3 more")


def test_the_condition_written_keeps_its_transition_time_while_the_status_stays() -> None:
    false = GpuHealthCondition("False", "GpuLost", "m2")
    current = {"type": CONDITION_TYPE, "status": "False", "reason": "FatalXid", "message": "m1"}
    assert condition_body(false, {**current, "lastTransitionTime": EARLIER}, "NOW") == {
        "type": CONDITION_TYPE,
        "status": "False",
        "reason": "GpuLost",
        "message": "m2",
        "lastHeartbeatTime": "NOW",
        "lastTransitionTime": EARLIER,
    }
    true = GpuHealthCondition("True", "GpusHealthy", "2 GPUs healthy")
    cleared = condition_body(true, {**current, "lastTransitionTime": EARLIER}, "NOW")
    assert cleared is not None and cleared["lastTransitionTime"] == "NOW"
    added = condition_body(true, None, "NOW")
    assert added is not None and added["lastTransitionTime"] == "NOW"
    said = {"status": "False", "reason": "GpuLost", "message": "m2"}
    assert condition_body(false, {**current, **said}, "NOW") is None


def test_taints_keep_the_other_clients_ones() -> None:
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ours = {"key": TAINT_KEY, "value": "GpuLost", "effect": "NoSchedule"}
    assert taints_with([other], "GpuLost", "NoSchedule", "NOW") == [other, ours]
    assert taints_with([other, ours], "GpuLost", "NoSchedule", "NOW") is None
    assert taints_with([ours, other], None, "NoSchedule", "NOW") == [other]
    assert taints_with([other], None, None, "NOW") is None
    assert taints_with([ours], "FatalXid", "NoExecute", "NOW") == [
        {"key": TAINT_KEY, "value": "FatalXid", "effect": "NoExecute", "timeAdded": "NOW"}
    ]


def test_a_fault_turned_fatal_is_what_the_condition_sees() -> None:
    """A fatal XID on a GPU already marked by a non-fatal one is no transition, yet it is sticky."""
    state = HealthState([full_gpu(0)], XidPolicy(), 300.0)
    state.event(NvmlEvent("GPU-0", EventType.XID_CRITICAL, 94), 1.0)
    assert not state.faults()["GPU-0"].fatal
    assert state.event(NvmlEvent("GPU-0", EventType.XID_CRITICAL, 79), 2.0) == []
    fault = state.faults()["GPU-0"]
    assert (fault.fatal, fault.xid) == (True, 79)
    said = gpu_health_condition([full_gpu(0)], state.faults())
    assert (said.status, said.reason) == ("False", "FatalXid")


def test_a_recovered_unit_holds_no_fault() -> None:
    state = HealthState([full_gpu(0)], XidPolicy(), 300.0)
    state.event(NvmlEvent("GPU-0", EventType.XID_CRITICAL, 94), 1.0)
    assert [c.healthy for c in state.probed("GPU-0", ProbeResult(), 301.0)] == [True]
    assert state.faults() == {}


def test_the_taint_setting_reaches_the_health_settings() -> None:
    config = parse({"health": {"taintOnFatal": "PreferNoSchedule"}})
    assert health_settings(config).taint_on_fatal == "PreferNoSchedule"
    assert parse(config.to_dict()) == config
    assert health_settings(parse({})).taint_on_fatal is None


# ---- the reporter against the API stand-in -------------------------------------------------------


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        standin.put(NODE_PATH, {"metadata": {"name": NODE}, "spec": {}, "status": {"conditions": [READY]}})
        yield standin


@pytest.fixture
def reporters() -> Iterator[list[NodeConditionReporter]]:
    started: list[NodeConditionReporter] = []
    yield started
    for reporter in started:
        reporter.close()


def start_reporter(
    api: KubeApiStandin,
    view: FakeNodeHealthView,
    started: list[NodeConditionReporter],
    *,
    settle: float = 0.0,
    pacing: Backoff | None = None,
) -> NodeConditionReporter:
    reporter = NodeConditionReporter(
        lambda: KubeNodeStatus(NODE, api_client=new_api_client(host=api.url, retries=0)),
        settle=settle,
        tick=0.05,
        pacing=pacing or Backoff(0.05, 0.05),
        retries=Backoff(0.05, 0.2),
    )
    started.append(reporter)
    reporter.start(view)
    return reporter


def stored_node(api: KubeApiStandin) -> dict[str, Any]:
    return api.objects[NODE_PATH]


def condition(api: KubeApiStandin) -> dict[str, Any] | None:
    return next((c for c in stored_node(api)["status"]["conditions"] if c["type"] == CONDITION_TYPE), None)


def said(api: KubeApiStandin) -> tuple[str, str] | None:
    found = condition(api)
    return (found["status"], found["reason"]) if found else None


def our_taints(api: KubeApiStandin) -> list[tuple[str, str]]:
    taints = stored_node(api)["spec"].get("taints") or []
    return [(t["value"], t["effect"]) for t in taints if t["key"] == TAINT_KEY]


def patches(api: KubeApiStandin) -> int:
    return api.count("PATCH", f"{NODE_PATH}/status") + api.count("PATCH", NODE_PATH)


def test_a_fatal_fault_sets_the_condition_once_beside_the_kubelets(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    view = FakeNodeHealthView(GPUS)
    reporter = start_reporter(api, view, reporters)
    wait_until(lambda: said(api) == ("True", "GpusHealthy"), 10, "condition True")
    view.current = {"GPU-1": xid_fault("GPU-1", 79, True)}
    reporter.changed()
    wait_until(lambda: said(api) == ("False", "FatalXid"), 10, "condition False")
    assert stored_node(api)["status"]["conditions"][0] == READY  # merged by type: the kubelet's kept
    written = condition(api)
    assert written is not None and "GPU 1 GPU-1: XID 79" in written["message"]
    for _ in range(20):  # nothing new to say: no more writes, whatever wakes the reporter
        reporter.changed()
    reads = api.count("GET", NODE_PATH)
    wait_until(lambda: api.count("GET", NODE_PATH) == reads and reporter.syncs == 2, 5, "quiet")
    assert api.count("PATCH", f"{NODE_PATH}/status") == 2
    assert api.count("PATCH", NODE_PATH) == 0  # no taint asked for: the Node itself is not patched


def test_a_healthy_start_clears_a_condition_left_by_an_earlier_run_after_settling(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    left = {"type": CONDITION_TYPE, "status": "False", "reason": "FatalXid", "message": "m"}
    api.merge_patch(NODE_PATH, {"status": {"conditions": [READY, {**left, "lastTransitionTime": EARLIER}]}})
    started = time.monotonic()
    start_reporter(api, FakeNodeHealthView(GPUS), reporters, settle=0.5)
    wait_until(lambda: said(api) == ("True", "GpusHealthy"), 10, "condition cleared")
    assert time.monotonic() - started >= 0.5
    written = condition(api)
    assert written is not None and written["lastTransitionTime"] != EARLIER


def test_a_reason_change_keeps_the_transition_time(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    view = FakeNodeHealthView(GPUS)
    view.current = {"GPU-0": xid_fault("GPU-0", 79, True)}
    reporter = start_reporter(api, view, reporters)
    wait_until(lambda: said(api) == ("False", "FatalXid"), 10, "FatalXid")
    first = condition(api)
    assert first is not None
    api.merge_patch(NODE_PATH, {"status": {"conditions": [READY, {**first, "lastTransitionTime": EARLIER}]}})
    view.current = {**view.current, "GPU-1": lost("GPU-1")}
    reporter.changed()
    wait_until(lambda: said(api) == ("False", "GpuLost"), 10, "GpuLost")
    second = condition(api)
    assert second is not None and second["lastTransitionTime"] == EARLIER


def test_the_taint_goes_on_when_no_gpu_is_left_and_off_on_recovery(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    api.merge_patch(NODE_PATH, {"spec": {"taints": [other]}})
    view = FakeNodeHealthView(GPUS, HealthSettings(taint_on_fatal="NoExecute"))
    view.current = {"GPU-0": lost("GPU-0")}
    reporter = start_reporter(api, view, reporters)
    wait_until(lambda: said(api) == ("False", "GpuLost"), 10, "condition False")
    assert our_taints(api) == []  # GPU 1 still serves
    view.current = {**view.current, "GPU-1": xid_fault("GPU-1", 94, False)}
    reporter.changed()
    wait_until(lambda: our_taints(api) == [("GpuLost", "NoExecute")], 10, "taint")
    assert stored_node(api)["spec"]["taints"][0] == other
    view.current = {"GPU-0": lost("GPU-0")}
    reporter.changed()
    wait_until(lambda: our_taints(api) == [], 10, "taint removed")
    assert stored_node(api)["spec"]["taints"] == [other]


def test_a_taint_left_when_the_setting_is_off_is_removed(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    ours = {"key": TAINT_KEY, "value": "GpuLost", "effect": "NoSchedule"}
    api.merge_patch(NODE_PATH, {"spec": {"taints": [ours]}})
    start_reporter(api, FakeNodeHealthView(GPUS), reporters)
    wait_until(lambda: said(api) == ("True", "GpusHealthy") and our_taints(api) == [], 10, "taint removed")


def test_a_failed_write_is_retried_with_backoff_and_said_once(
    api: KubeApiStandin, reporters: list[NodeConditionReporter], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.health.node_condition")
    api.fail(500, 3, method="PATCH")
    view = FakeNodeHealthView(GPUS)
    view.current = {"GPU-0": lost("GPU-0")}
    reporter = start_reporter(api, view, reporters)
    wait_until(lambda: said(api) == ("False", "GpuLost"), 10, "condition after the failures")
    wait_until(lambda: "node condition written again" in [r.getMessage() for r in caplog.records], 10, "line")
    assert reporter.failures == 3
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("node condition not written; retrying") == 1


def test_a_taint_list_changed_under_the_write_is_read_again(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    """The taint patch names the resourceVersion it read: a stale one is a 409, then a fresh read."""
    view = FakeNodeHealthView([full_gpu(0)], HealthSettings(taint_on_fatal="NoSchedule"))
    view.current = {"GPU-0": lost("GPU-0")}
    reporter = NodeConditionReporter(
        lambda: RacedNodeStatus(api),
        settle=0,
        tick=0.05,
        pacing=Backoff(0.05, 0.05),
        retries=Backoff(0.05, 0.2),
    )
    reporters.append(reporter)
    reporter.start(view)
    wait_until(lambda: our_taints(api) == [("GpuLost", "NoSchedule")], 10, "taint")
    assert reporter.failures == 1
    assert {t["key"] for t in stored_node(api)["spec"]["taints"]} == {"example.com/raced", TAINT_KEY}


class RacedNodeStatus(KubeNodeStatus):
    """Another client adds a taint between the first read and the first taint write."""

    def __init__(self, api: KubeApiStandin) -> None:
        super().__init__(NODE, api_client=new_api_client(host=api.url, retries=0))
        self.api, self.raced = api, False

    def replace_taints(self, taints: Any, resource_version: str) -> None:
        if not self.raced:
            self.raced = True
            self.api.merge_patch(
                NODE_PATH, {"spec": {"taints": [{"key": "example.com/raced", "effect": "NoSchedule"}]}}
            )
        super().replace_taints(taints, resource_version)


def test_a_hundred_flaps_cost_a_few_writes_of_the_latest_state(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    view = CountingView(GPUS, HealthSettings(taint_on_fatal="NoSchedule"))
    view.current = {"GPU-0": lost("GPU-0")}
    reporter = start_reporter(api, view, reporters, pacing=Backoff(1.0, 30.0, reset_after=60.0))
    wait_until(lambda: said(api) == ("False", "GpuLost"), 10, "condition False")
    for n in range(200):  # GPU 1 down, up, down, ...: the taint's on, off, on...
        flapped = {"GPU-1": xid_fault("GPU-1", 94, False)} if n % 2 == 0 else {}
        view.current = {"GPU-0": lost("GPU-0"), **flapped}
        reporter.changed()
        view.looked.wait(5)  # the reporter's next look (a read of the faults)
        view.looked.clear()
    view.current = {"GPU-0": lost("GPU-0"), "GPU-1": xid_fault("GPU-1", 94, False)}
    reporter.changed()
    wait_until(lambda: our_taints(api) == [("GpuLost", "NoSchedule")], 10, "the last state written")
    assert patches(api) <= 4, api.requests
    assert api.count("GET", NODE_PATH) <= 4


class CountingView(FakeNodeHealthView):
    """Says when the reporter read the faults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.looked = threading.Event()

    def faults(self) -> dict[str, HealthChange]:
        found = super().faults()
        self.looked.set()
        return found


def test_changed_never_waits_on_a_slow_api_server(
    api: KubeApiStandin, reporters: list[NodeConditionReporter]
) -> None:
    api.late_bodies = 2.0
    view = FakeNodeHealthView(GPUS)
    view.current = {"GPU-0": lost("GPU-0")}
    reporter = start_reporter(api, view, reporters)
    wait_until(lambda: api.count("GET", NODE_PATH) == 1, 10, "a read under way")
    began = time.monotonic()
    for _ in range(1000):
        reporter.changed()
    assert time.monotonic() - began < 0.5
    api.late_bodies = 0.0


def test_from_env(tmp_path: Path) -> None:
    token = tmp_path / "token"
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert node_condition_from_env(in_cluster, node="", token_file=str(token)) is None
    assert node_condition_from_env(in_cluster, node=NODE, token_file=str(token)) is None  # no token
    assert node_condition_from_env({}, node=NODE, kubeconfig="kc", token_file=str(token)) is not None
    token.write_text("t")
    assert node_condition_from_env(in_cluster, node=NODE, token_file=str(token)) is not None


def test_the_api_transport_is_loaded_with_the_first_write(tmp_path: Path) -> None:
    with KubeApiStandin() as api:
        api.put(NODE_PATH, {"metadata": {"name": NODE}, "status": {}})
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code = f"""
import sys
from nvdp.base.ssl_block import block_ssl
block_ssl()
from nvdp.node.health.node_condition import node_condition_from_env
from nvdp.node.health.types import HealthChange
from testkit import wait_until
from tests.builders import full_gpu
from tests.fakes import FakeNodeHealthView
reporter = node_condition_from_env({{}}, node={NODE!r}, kubeconfig={str(kubeconfig)!r})
view = FakeNodeHealthView([full_gpu(0)])
view.current = {{"GPU-0": HealthChange("GPU-0", False, "lost", None, True)}}
view.started = False
reporter.start(view)
reporter.changed()
before = "urllib3" in sys.modules or "kubernetes" in sys.modules or sys.modules.get("ssl") is not None
view.started = True
reporter.changed()
wait_until(lambda: reporter.syncs, 60, "a write")
print(before, "urllib3" in sys.modules)
"""
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
