"""The allocation ledger through the whole plugin process: pods admitted through the kubelet stand-in
(which serves them on the PodResources API, as a kubelet does) show up in /allocations, in
nvdp_device_allocated and in `nvdp status`, with the devices they got: whole GPUs, replicas, MIG."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, free_port, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.readings import http_get, status_lines

GPU = "nvidia.com/gpu"
TIME_SLICING = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)


class LedgerNode:
    """A kubelet stand-in with PodResources in `root` (plugin dir root/device-plugins) and a plugin
    serving metrics on `port`."""

    def __init__(self, root: Path, kubelet: Kubelet, plugin: Process, port: int) -> None:
        self.root, self.kubelet, self.plugin, self.port = root, kubelet, plugin, port

    def allocations(self) -> dict[str, object]:
        status, body = http_get(self.port, "/allocations")
        assert status == 200, body
        document: dict[str, object] = json.loads(body)
        return document

    def held(self, resource: str) -> dict[str, list[tuple[str, str, str | None, str]]]:
        """Device -> (namespace, pod, uid, container) of each holder, for the held devices of `resource`."""
        devices = self.allocations()["resources"][resource]  # type: ignore[index]
        return {
            d["device"]: [(p["namespace"], p["name"], p["uid"], p["container"]) for p in d["pods"]]
            for d in devices
            if d["pods"]
        }

    def allocated_samples(self) -> list[str]:
        status, body = http_get(self.port, "/metrics")
        assert status == 200
        return sorted(line for line in body.splitlines() if line.startswith("nvdp_device_allocated{"))


@pytest.fixture
def ledger_node(sock_dir: Path, tmp_path: Path, processes: list[Process]) -> Iterator[object]:
    kubelets: list[Kubelet] = []

    def start(
        profile: str = "dgx-a100", config: str = "version: v1\n", args: tuple[str, ...] = ()
    ) -> LedgerNode:
        plugin_dir = sock_dir / "device-plugins"
        kubelet = Kubelet(plugin_dir, pod_resources=True)
        kubelet.start()
        kubelets.append(kubelet)
        config_file = tmp_path / "config.yaml"
        config_file.write_text(config)
        port = free_port()
        plugin = start_plugin(
            plugin_dir,
            f"sim:{profile}",
            config_file=config_file,
            metrics_address=f"127.0.0.1:{port}",
            extra=args,
            log_path=tmp_path / "plugin.log",
        )
        processes.append(plugin)
        kubelet.wait_for_registration(GPU, timeout=20)
        kubelet.wait_for_devices(GPU, timeout=10)
        return LedgerNode(sock_dir, kubelet, plugin, port)

    yield start
    for kubelet in kubelets:
        kubelet.stop()


def test_whole_gpus_held_by_pods_show_in_allocations_and_metrics(ledger_node: object) -> None:
    node: LedgerNode = ledger_node()  # type: ignore[operator]
    gpus = sim_gpus("dgx-a100")
    assert node.held(GPU) == {}
    train = node.kubelet.admit_pod("ml", "train-0", {"main": {GPU: 2}, "sidecar": {GPU: 1}}, uid="uid-train")
    infer = node.kubelet.admit_pod("web", "infer-0", {"server": {GPU: 1}}, uid="uid-infer")
    got = {a.container: a.device_ids for a in (*train.assignments, *infer.assignments)}
    held = {
        **{i: [("ml", "train-0", "uid-train", "main")] for i in got["main"]},
        **{i: [("ml", "train-0", "uid-train", "sidecar")] for i in got["sidecar"]},
        **{i: [("web", "infer-0", "uid-infer", "server")] for i in got["server"]},
    }
    # read after the Allocates, and on demand: the page is never older than a second
    wait_until(lambda: node.held(GPU) == held, timeout=5, what="the pods in /allocations")
    entry = next(d for d in node.allocations()["resources"][GPU] if d["device"] == got["server"][0])  # type: ignore[index]
    gpu = next(g for g in gpus if g.uuid == got["server"][0])
    assert entry == {
        "device": gpu.uuid,
        "gpu": gpu.uuid,
        "uuid": gpu.uuid,
        "index": str(gpu.index),
        "advertised": True,
        "health": "Healthy",
        "pods": [{"namespace": "web", "name": "infer-0", "uid": "uid-infer", "container": "server"}],
    }
    assert node.allocated_samples() == sorted(
        f'nvdp_device_allocated{{resource="{GPU}",device="{i}",gpu_uuid="{i}",namespace="{ns}",'
        f'pod="{pod}",container="{container}"}} 1'
        for i, holders in held.items()
        for ns, pod, _, container in holders
    )
    node.kubelet.remove_pod("ml", "train-0")  # no Allocate: read on demand
    wait_until(lambda: set(node.held(GPU)) == set(got["server"]), timeout=5, what="train-0 let go")
    assert len(node.allocated_samples()) == 1


def test_replicas_map_back_to_their_gpu(ledger_node: object) -> None:
    node: LedgerNode = ledger_node(config=TIME_SLICING)  # type: ignore[operator]
    a = node.kubelet.admit_pod("ml", "a", {"main": {GPU: 1}})
    b = node.kubelet.admit_pod("ml", "b", {"main": {GPU: 1}})
    ids = [a.assignments[0].device_ids[0], b.assignments[0].device_ids[0]]
    assert all("::" in i for i in ids)
    wait_until(lambda: set(node.held(GPU)) == set(ids), timeout=5, what="both pods in /allocations")
    devices = {d["device"]: d for d in node.allocations()["resources"][GPU]}  # type: ignore[index]
    assert len(devices) == 32
    for device_id, pod in zip(ids, (a, b), strict=True):
        gpu = device_id.partition("::")[0]
        assert (devices[device_id]["gpu"], devices[device_id]["uuid"]) == (gpu, gpu)
        assert devices[device_id]["pods"] == [
            {"namespace": "ml", "name": pod.name, "uid": pod.uid, "container": "main"}
        ]
    samples = node.allocated_samples()
    assert [s.split('gpu_uuid="')[1].split('"')[0] for s in samples] == sorted(
        i.partition("::")[0] for i in ids
    )


def test_mig_devices_map_back_to_their_parent_gpu(ledger_node: object) -> None:
    node: LedgerNode = ledger_node(  # type: ignore[operator]
        profile="dgx-a100-mig", args=("--mig-strategy", "mixed")
    )
    resource = "nvidia.com/mig-2g.10gb"
    node.kubelet.wait_for_devices(resource, timeout=10)
    pod = node.kubelet.admit_pod("ml", "small", {"main": {resource: 2}})
    held = pod.assignments[0].device_ids
    wait_until(lambda: set(node.held(resource)) == set(held), timeout=5, what="the pod in /allocations")
    migs = {m.uuid: (g, m) for g in sim_gpus("dgx-a100-mig") for m in g.mig_devices}
    devices = {d["device"]: d for d in node.allocations()["resources"][resource]}  # type: ignore[index]
    for mig_uuid in held:
        gpu, mig = migs[mig_uuid]
        assert devices[mig_uuid]["gpu"] == gpu.uuid and devices[mig_uuid]["uuid"] == mig_uuid
        assert devices[mig_uuid]["index"] == f"{gpu.index}:{mig.index}"
    assert all(f'gpu_uuid="{migs[m][0].uuid}"' in " ".join(node.allocated_samples()) for m in held)
    assert len(node.allocated_samples()) == 2


def test_status_prints_the_ledger_of_the_running_plugin(ledger_node: object) -> None:
    node: LedgerNode = ledger_node()  # type: ignore[operator]
    pod = node.kubelet.admit_pod("ml", "train-0", {"main": {GPU: 1}})
    device_id = pod.assignments[0].device_ids[0]
    wait_until(lambda: node.held(GPU), timeout=5, what="the pod in /allocations")
    lines = status_lines(node.port)
    assert lines[0] == f"nvdp status: http://127.0.0.1:{node.port}/allocations"
    assert lines[1].startswith(
        f"Allocations (kubelet PodResources at {node.root}/pod-resources/kubelet.sock, read "
    )
    assert f"{GPU}  8 devices: 1 held, 0 not healthy, 7 free" in lines
    (row,) = [line for line in lines if line.startswith(f"  {device_id}")]
    assert row.split() == [
        device_id,
        str(next(g.index for g in sim_gpus() if g.uuid == device_id)),
        "Healthy",
        "ml/train-0",
        "(main)",
    ]


def test_without_the_socket_one_line_and_the_rest_works(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    """The plugin dir's parent has no pod-resources/kubelet.sock (an old kubelet, a plugin run by hand)."""
    port = free_port()
    plugin = start_plugin(sock_dir, metrics_address=f"127.0.0.1:{port}")
    processes.append(plugin)
    kubelet.wait_for_devices(GPU, timeout=20)
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, timeout=20, what="ready")
    missing = sock_dir.parent / "pod-resources" / "kubelet.sock"
    lines = [line for line in plugin.log().splitlines() if "PodResources" in line]
    assert len(lines) == 1 and " INFO " in lines[0]
    assert lines[0].endswith(
        "no PodResources socket: pods holding devices are unknown until the kubelet serves it "
        f"socket={missing}"
    )
    status, body = http_get(port, "/allocations")
    document = json.loads(body)
    assert status == 200 and document["readAt"] is None
    assert document["problem"] == f"no PodResources socket at {missing}"
    assert [d["pods"] for d in document["resources"][GPU]] == [[]] * 8
    kubelet.allocate(GPU, [[sim_gpus()[0].uuid]])  # serving goes on
    assert len([line for line in plugin.log().splitlines() if "PodResources" in line]) == 1
