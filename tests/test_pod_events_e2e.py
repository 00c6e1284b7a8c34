"""Health events that name the pods hit, through the whole plugin process: pods admitted through the
kubelet stand-in hold replicas of one GPU, an XID arrives on it (NVDP_SIM_EVENTS), and the API
stand-in (reached through KUBECONFIG) records one Warning event on each pod and a Node event naming
both; a GPU that flaps a hundred times writes a handful of events, not hundreds."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvdp.sim.kubelet import AdmittedPod, Kubelet
from testkit import Process, free_port, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.kube_api_standin import KubeApiStandin
from tests.readings import http_get

GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"
SHARED = (
    "version: v1\n"
    "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n"  # the second replica on the same GPU
    "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
)


@dataclass
class FaultNode:
    kubelet: Kubelet
    plugin: Process
    api: KubeApiStandin
    events: Path
    port: int

    def wait_held(self, *pods: AdmittedPod) -> None:
        """Until /allocations (read on demand) shows each pod's devices."""
        want = {i for pod in pods for a in pod.assignments for i in a.device_ids}

        def held() -> set[str]:
            status, body = http_get(self.port, "/allocations")
            devices = json.loads(body)["resources"][GPU] if status == 200 else []
            return {d["device"] for d in devices if d["pods"]}

        wait_until(lambda: held() == want, timeout=10, what="the pods in the ledger")

    def event_posts(self) -> int:
        return sum(
            1 for method, path, _ in self.api.requests if method == "POST" and path.endswith("/events")
        )


@pytest.fixture
def fault_node(sock_dir: Path, tmp_path: Path, processes: list[Process]) -> Iterator[object]:
    started: list[tuple[Kubelet, KubeApiStandin]] = []

    def start(health: str = "") -> FaultNode:
        api = KubeApiStandin().start()
        kubelet = Kubelet(sock_dir / "device-plugins", pod_resources=True)
        kubelet.start()
        started.append((kubelet, api))
        events = tmp_path / "events.jsonl"
        events.touch()
        config = tmp_path / "config.yaml"
        config.write_text(SHARED + health)
        port = free_port()
        env = {
            "NVDP_SIM_EVENTS": str(events),
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "NODE_NAME": NODE,
        }
        plugin = start_plugin(
            sock_dir / "device-plugins",
            "sim:pcie-4",
            config_file=config,
            metrics_address=f"127.0.0.1:{port}",
            env=env,
            log_path=tmp_path / "plugin.log",
        )
        processes.append(plugin)
        kubelet.wait_for_devices(GPU, timeout=20)
        wait_until(lambda: "health monitor" in plugin.log(), timeout=10, what="health monitor start")
        return FaultNode(kubelet, plugin, api, events, port)

    yield start
    for kubelet, api in started:
        kubelet.stop()
        api.stop()


def test_an_xid_on_a_gpu_held_by_two_replica_pods_names_both(fault_node: object) -> None:
    node: FaultNode = fault_node()  # type: ignore[operator]
    a = node.kubelet.admit_pod("ml", "train-a", {"main": {GPU: 1}}, uid="uid-a")
    b = node.kubelet.admit_pod("ml", "train-b", {"worker": {GPU: 1}}, uid="uid-b")
    (id_a,), (id_b,) = a.assignments[0].device_ids, b.assignments[0].device_ids
    gpu_uuid = id_a.partition("::")[0]
    assert id_b.partition("::")[0] == gpu_uuid  # packed: both replicas of one GPU
    gpu = next(g for g in sim_gpus("pcie-4") if g.uuid == gpu_uuid)
    node.wait_held(a, b)

    append_sim_event(node.events, uuid=gpu_uuid, xid=79)
    wait_until(lambda: len(node.api.events("Pod")) == 2, timeout=20, what="two pod events")
    wait_until(lambda: node.api.events("Node", NODE), timeout=10, what="the Node event")
    first, second = node.api.events("Pod", "train-a", "ml"), node.api.events("Pod", "train-b", "ml")
    assert len(first) == 1 and len(second) == 1
    event = first[0]
    assert event["metadata"]["namespace"] == "ml"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "train-a",
        "uid": "uid-a",  # from the kubelet's checkpoint: `kubectl describe pod` selects on it
        "fieldPath": "spec.containers{main}",
    }
    assert (event["type"], event["reason"]) == ("Warning", "GPUUnhealthy")
    since = re.search(r" since (\S+Z): ", event["message"])
    assert since is not None
    age = datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(since[1])
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=1)
    assert event["message"] == (
        f"GPU {gpu.index} ({gpu_uuid}) is unhealthy since {since[1]}: XID 79, GPU has fallen off the "
        f"bus. This pod holds {GPU} {id_a} on it (container main). nvdp does not expect it to recover: it "
        "stays Unhealthy until the GPU is reset and the device plugin restarted."
    )
    assert second[0]["involvedObject"]["uid"] == "uid-b"
    assert f"holds {GPU} {id_b} on it (container worker)" in second[0]["message"]
    (node_event,) = node.api.events("Node", NODE)
    assert node_event["message"] == (
        f"device unhealthy resource={GPU} device={gpu_uuid} index={gpu.index} xid=79 "
        'reason="GPU has fallen off the bus" fatal=true pods=ml/train-a,ml/train-b'
    )
    (line,) = [li for li in node.plugin.log().splitlines() if "device unhealthy" in li]
    assert line.endswith("fatal=true pods=ml/train-a,ml/train-b")


@pytest.mark.soak
def test_a_gpu_flapping_a_hundred_times_writes_a_handful_of_events(fault_node: object) -> None:
    node: FaultNode = fault_node(health="health:\n  recoveryQuietPeriod: 10ms\n  probeInterval: 10ms\n")  # type: ignore[operator]
    a = node.kubelet.admit_pod("ml", "train-a", {"main": {GPU: 1}})
    b = node.kubelet.admit_pod("ml", "train-b", {"main": {GPU: 1}})
    gpu_uuid = a.assignments[0].device_ids[0].partition("::")[0]
    node.wait_held(a, b)
    # Each flap is waited for in the plugin's log: down and up again within 20 ms, it may never reach
    # the kubelet (ListAndWatch sends the devices as they are when it sends).
    for flap in range(1, 101):
        append_sim_event(node.events, uuid=gpu_uuid, xid=94)  # contained ECC error: recovers
        wait_until(lambda n=flap: node.plugin.log().count("device healthy") == n, 15, f"flap {flap}")
    assert node.plugin.log().count("device unhealthy") == 100  # every transition is in the log
    wait_until(lambda: node.event_posts() >= 12, timeout=20, what="the events let through")
    # two cycles' worth per subject: the GPU's Node events, each pod's events about the GPU
    assert len(node.api.events("Node", NODE)) == 4
    assert [len(node.api.events("Pod", p, "ml")) for p in ("train-a", "train-b")] == [4, 4]
    assert node.event_posts() == 12
    assert node.plugin.log().count("events left out: too many for one subject") == 3
