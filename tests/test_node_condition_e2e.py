"""The GPU health condition, the taint and Node events end to end: a real plugin process (simulated
NVML, NVDP_SIM_EVENTS fault injection) registered with the kubelet stand-in, reaching the API
stand-in through a kubeconfig (KUBECONFIG / --kubeconfig), as a plugin run by hand next to a kubelet
does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.base.timers import as_env
from nvdp.node.health.condition import TAINT_KEY
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.kube_api_standin import KubeApiStandin
from tests.test_node_condition import NODE, NODE_PATH, READY, condition, our_taints, said, stored_node

GPU = "nvidia.com/gpu"
SETTLE_S = 0.3  # a healthy node is confirmed this long after the monitor runs (production: 3 s)
PCIE = sim_gpus("pcie-4")
FAST_RECOVERY = "version: v1\nhealth:\n  recoveryQuietPeriod: 100ms\n  probeInterval: 20ms\n"
FLAPPING = (
    "version: v1\nhealth:\n  recoveryQuietPeriod: 20ms\n  probeInterval: 5ms\n  taintOnFatal: NoSchedule\n"
)


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        standin.put(NODE_PATH, {"metadata": {"name": NODE}, "spec": {}, "status": {"conditions": [READY]}})
        yield standin


class ReportingNode:
    """The kubelet stand-in and a plugin reporting to the API stand-in, on the simulated pcie-4 node."""

    def __init__(self, sock_dir: Path, tmp_path: Path, api: KubeApiStandin, config: str) -> None:
        self.sock_dir, self.tmp_path, self.api = sock_dir, tmp_path, api
        self.events = tmp_path / "events.jsonl"
        self.events.touch()
        self.config = tmp_path / "config.yaml"
        self.config.write_text(config)
        self.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        self.kubelet = Kubelet(sock_dir)
        self.kubelet.start()
        self.plugins: list[Process] = []

    def start(self, *, through_env: bool) -> Process:
        """The plugin, given the kubeconfig and node name as env vars or as flags."""
        env = {"NVDP_SIM_EVENTS": str(self.events), **as_env(node_condition_settle=SETTLE_S)}
        extra: tuple[str, ...] = ()
        if through_env:
            env |= {"KUBECONFIG": str(self.kubeconfig), "NODE_NAME": NODE}
        else:
            extra = ("--kubeconfig", str(self.kubeconfig), "--node-name", NODE)
        log = self.tmp_path / f"plugin-{len(self.plugins)}.log"
        plugin = start_plugin(
            self.sock_dir, "sim:pcie-4", config_file=self.config, env=env, extra=extra, log_path=log
        )
        self.plugins.append(plugin)
        self.kubelet.wait_for_registration(GPU, timeout=30)
        self.kubelet.wait_for_devices(GPU, timeout=10)
        return plugin

    def inject(self, index: int, xid: int) -> None:
        append_sim_event(self.events, uuid=PCIE[index].uuid, xid=xid)

    def wait_unhealthy(self, indices: set[int], timeout: float = 15.0) -> None:
        wanted = {PCIE[i].uuid for i in indices}
        self.kubelet.wait_for_devices(
            GPU, lambda d: {i for i, s in d.items() if s.health != "Healthy"} == wanted, timeout=timeout
        )

    def stop(self) -> None:
        for plugin in self.plugins:
            plugin.stop()
        self.kubelet.stop()


@pytest.fixture
def reporting_node(sock_dir: Path, tmp_path: Path, api: KubeApiStandin) -> Iterator[list[ReportingNode]]:
    made: list[ReportingNode] = []
    yield made
    for made_node in made:
        for plugin in made_node.plugins:
            print(f"---- {plugin.log_path.name}\n{plugin.log()[-6000:]}")
        made_node.stop()


def test_fatal_xids_set_the_condition_and_events_go_through_kubeconfig(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, reporting_node: list[ReportingNode]
) -> None:
    """No taint without health.taintOnFatal, even with every GPU down; a plugin restarted on healthy
    GPUs (a GPU reset, a reboot) clears the condition."""
    made = ReportingNode(sock_dir, tmp_path, api, "version: v1\n")
    reporting_node.append(made)
    plugin = made.start(through_env=True)
    for index in range(4):
        made.inject(index, 79)
    made.wait_unhealthy({0, 1, 2, 3})
    wait_until(lambda: "4 of 4 GPUs" in (condition(api) or {}).get("message", ""), 20, "condition False")
    assert said(api) == ("False", "FatalXid")
    written = condition(api)
    assert written is not None
    assert f"GPU 3 {PCIE[3].uuid}: XID 79 (GPU has fallen off the bus)" in written["message"]
    assert stored_node(api)["status"]["conditions"][0] == READY
    assert our_taints(api) == [] and api.count("PATCH", NODE_PATH) == 0
    events = wait_until(
        lambda: [e for e in api.created if e["reason"] == "GPUUnhealthy"] if len(api.created) >= 4 else None,
        20,
        "Node events",
    )
    assert {e["involvedObject"]["name"] for e in events} == {NODE}
    # said once the API answered the write, which may be a moment after the test saw it stored
    wait_until(lambda: "node condition set" in plugin.log(), 10, "the condition's log line")
    plugin.stop()

    made.start(through_env=False)  # flags this time
    wait_until(lambda: said(api) == ("True", "GpusHealthy"), 20, "condition cleared")
    cleared = condition(api)
    assert cleared is not None and cleared["lastTransitionTime"] >= written["lastTransitionTime"]
    assert cleared["message"] == "4 GPUs healthy"


def test_the_taint_only_when_no_gpu_is_left_and_off_when_one_recovers(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, reporting_node: list[ReportingNode]
) -> None:
    config = (
        "version: v1\nhealth:\n  recoveryQuietPeriod: 2s\n  probeInterval: 50ms\n  taintOnFatal: NoSchedule\n"
    )
    made = ReportingNode(sock_dir, tmp_path, api, config)
    reporting_node.append(made)
    made.start(through_env=False)
    for index in range(3):
        made.inject(index, 79)
    made.wait_unhealthy({0, 1, 2})
    wait_until(lambda: said(api) == ("False", "FatalXid"), 20, "condition False")
    assert our_taints(api) == []  # GPU 3 still serves
    made.inject(3, 94)  # contained memory error: recovers after the quiet period, longer than a write
    wait_until(lambda: our_taints(api) == [("FatalXid", "NoSchedule")], 20, "taint")
    wait_until(lambda: our_taints(api) == [], 20, "taint removed when GPU 3 recovered")
    made.wait_unhealthy({0, 1, 2})
    assert said(api) == ("False", "FatalXid")
    assert [t["key"] for t in stored_node(api)["spec"]["taints"]] == []
    assert TAINT_KEY not in str(stored_node(api)["spec"])


def test_a_fault_that_recovers_leaves_the_condition_true(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, reporting_node: list[ReportingNode]
) -> None:
    made = ReportingNode(sock_dir, tmp_path, api, FAST_RECOVERY)
    reporting_node.append(made)
    made.start(through_env=True)
    wait_until(lambda: said(api) == ("True", "GpusHealthy"), 20, "condition True")
    made.inject(2, 94)
    made.wait_unhealthy({2})
    made.wait_unhealthy(set())
    assert said(api) == ("True", "GpusHealthy")
    assert api.count("PATCH", f"{NODE_PATH}/status") == 1


def test_an_unreachable_api_is_one_line_and_health_goes_on(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, reporting_node: list[ReportingNode]
) -> None:
    made = ReportingNode(sock_dir, tmp_path, api, "version: v1\n")
    reporting_node.append(made)
    made.kubeconfig = tmp_path / "missing-kubeconfig"
    plugin = made.start(through_env=False)
    made.inject(1, 79)
    made.wait_unhealthy({1})
    made.inject(2, 48)
    made.wait_unhealthy({1, 2})
    error = f"cannot load kubeconfig {made.kubeconfig}: no such file"
    line = f'node condition not written; retrying error="{error}"'
    wait_until(lambda: line in plugin.log(), 20, "the warning")
    assert plugin.log().count("node condition not written") == 1
    assert plugin.alive() and api.requests == []  # the stand-in never heard of it


@pytest.mark.soak
def test_a_gpu_flapping_a_hundred_times_costs_a_few_api_writes(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, reporting_node: list[ReportingNode]
) -> None:
    """Three GPUs down for good, the fourth flapping: each flap would put the taint on and off."""
    made = ReportingNode(sock_dir, tmp_path, api, FLAPPING)
    reporting_node.append(made)
    plugin = made.start(through_env=True)
    for index in range(3):
        made.inject(index, 79)
    made.wait_unhealthy({0, 1, 2})
    wait_until(lambda: said(api) == ("False", "FatalXid"), 20, "condition False")
    writes_before = api.count("PATCH", f"{NODE_PATH}/status") + api.count("PATCH", NODE_PATH)
    reads_before = api.count("GET", NODE_PATH)
    recovered = f"device healthy resource=nvidia.com/gpu device={PCIE[3].uuid}"
    # Each flap is waited for in the plugin's log: down and up again within 20 ms, it may never reach
    # the kubelet (ListAndWatch sends the devices as they are when it sends).
    for flap in range(1, 101):
        made.inject(3, 94)
        wait_until(lambda n=flap: plugin.log().count(recovered) == n, 15, f"flap {flap}")
    made.wait_unhealthy({0, 1, 2})
    wait_until(lambda: our_taints(api) == [], 60, "the last state (GPU 3 up) written")
    assert plugin.log().count(recovered) == 100
    writes = api.count("PATCH", f"{NODE_PATH}/status") + api.count("PATCH", NODE_PATH) - writes_before
    reads = api.count("GET", NODE_PATH) - reads_before
    posted = len(api.created)  # Node events: one per transition, by design (not rate-limited)
    print(f"100 flaps: {writes} patches, {reads} reads of the Node; {posted} Node events in all")
    assert writes <= 12 and reads <= 12
