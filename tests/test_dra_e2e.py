"""`nvdp dra-kubelet-plugin` as a process, over real sockets, with the kubelet stand-in (its plugin
watcher and DRA manager), the API stand-in and the stand-in scheduler: registration and
re-registration, the published slices, claims prepared and unprepared (one GPU, a MIG profile chosen
by attribute, one claim shared by two pods), per-claim errors, the kubelet of 1.32-1.33 (v1beta1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nvdp.plugins.dra.names import REGISTRATION_SOCKET
from nvdp.sim.kubelet.dra import Claim
from nvdp.sim.kubelet.plugin_watcher import PluginWatcher
from testkit import wait_until
from tests.cdi_support import load_schema, validate
from tests.dra_support import NODE_UID, claim_path, dra_cluster, make_claim, schedule, slices_of
from tests.test_cdi import strict_schema

GOLDEN = Path(__file__).parent / "data" / "dra"


def remove_directory(path: Path) -> None:
    """Remove a directory the plugin is writing in at once: renamed away, then removed (an rmtree in
    place fails when the plugin serves its socket again in the directory meanwhile)."""
    shutil.rmtree(path.rename(path.with_name(f"{path.name}.removed")))


def test_registers_publishes_and_registers_again_after_a_kubelet_restart(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        plugin = cluster.watcher.plugins["gpu.nvidia.com"]
        assert (plugin.service, plugin.health_service) == ("v1.DRAPlugin", "v1.DRAResourceHealth")
        assert plugin.endpoint == str(cluster.node.plugins / "gpu.nvidia.com" / "dra.sock")
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        golden = json.loads((GOLDEN / "slices-pcie-4.json").read_text())
        assert [s["spec"] for s in slices_of(cluster.api)] == [g["spec"] for g in golden]
        owner = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": NODE_UID, "controller": True}
        assert slices_of(cluster.api)[0]["metadata"]["ownerReferences"] == [owner]
        wait_until(
            lambda: "registered with the kubelet" in cluster.log(), 5, "NotifyRegistrationStatus logged"
        )

        cluster.watcher.restart()  # a kubelet restart: it reads plugins_registry again ...
        cluster.registered(after=1)
        (path,) = [p for p in cluster.api.objects if "/resourceslices/" in p]
        cluster.api.delete(path)  # ... and wipes the node's slices
        wait_until(lambda: path in cluster.api.objects, 5, "the slice published again")

        remove_directory(cluster.node.registry)  # a kubelet reinstall: the directory goes and comes back
        cluster.node.registry.mkdir(exist_ok=True)  # the plugin may have made it first
        cluster.registered(after=2)
        wait_until(lambda: (cluster.node.registry / REGISTRATION_SOCKET).is_socket(), 5, "served again")
        assert "socket removed or replaced; serving it again" in cluster.log()

        dra_socket = cluster.node.plugins / "gpu.nvidia.com" / "dra.sock"
        removals = (dra_socket.unlink, lambda: remove_directory(dra_socket.parent), dra_socket.unlink)
        for n, remove in enumerate(removals):
            remove()  # the file, its directory, then the file in the directory made again
            wait_until(lambda: dra_socket.is_socket(), 5, "the DRA socket served again")
            cluster.registered(after=3 + n)  # one server: its registration socket is made again too
        claim = make_claim(cluster.api, "after")
        schedule(cluster.api, claim)
        assert not cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid].error


def test_one_gpu_claim_is_prepared_and_unprepared(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        claim = make_claim(cluster.api, "one-gpu")
        assert schedule(cluster.api, claim) == ["gpu-0"]
        (device,) = cluster.kubelet.start_pod("pod-1", "gpu.nvidia.com", [claim])[claim.uid]
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"],
            "node-a",
            "gpu-0",
        )
        assert list(device.cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=uid-one-gpu-gpu-0"]
        spec = cluster.specs()["k8s.gpu.nvidia.com-claim_uid-one-gpu.json"]
        assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
        assert [d["name"] for d in spec["devices"]] == ["uid-one-gpu-gpu-0"]
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert [n["path"] for n in nodes] == ["/dev/nvidia0"]
        assert nodes[0]["hostPath"] == str(cluster.node.driver_root / "dev/nvidia0")
        assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
        assert validate(spec, load_schema(), strict=False) == [] and validate(spec, strict_schema()) == []
        assert json.loads(cluster.node.checkpoint.read_text())["claims"][claim.uid]["name"] == "one-gpu"

        assert cluster.kubelet.end_pod("pod-1", "gpu.nvidia.com", [claim]) == [claim.uid]
        assert cluster.specs() == {}
        assert json.loads(cluster.node.checkpoint.read_text())["claims"] == {}


def test_a_mig_profile_is_chosen_by_attribute(tmp_path: Path) -> None:
    with dra_cluster(tmp_path, "sim:dgx-a100-mig") as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        selector = "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'"
        claim = make_claim(cluster.api, "mig", "mig.nvidia.com", selector)
        assert schedule(cluster.api, claim) == ["gpu-2-mig-3g20gb-9-0"]
        (device,) = cluster.kubelet.start_pod("pod-1", "gpu.nvidia.com", [claim])[claim.uid]
        spec = cluster.specs()[f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"]
        paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        assert paths[0] == "/dev/nvidia2" and all(p.startswith("/dev/nvidia-caps/") for p in paths[1:])
        assert validate(spec, strict_schema()) == []
        whole = make_claim(cluster.api, "whole", "gpu.nvidia.com")
        assert schedule(cluster.api, whole) == ["gpu-4"]  # GPUs 0-3 are MIG-enabled: no whole GPU there
        assert cluster.kubelet.end_pod("pod-1", "gpu.nvidia.com", [claim]) == [claim.uid]


def test_one_claim_shared_by_two_pods_is_prepared_once_and_unprepared_after_the_last(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        claim = make_claim(cluster.api, "shared")
        schedule(cluster.api, claim)
        first = cluster.kubelet.start_pod("pod-a", "gpu.nvidia.com", [claim])
        second = cluster.kubelet.start_pod("pod-b", "gpu.nvidia.com", [claim])
        assert first == second
        assert cluster.log().count("claim prepared") == 1
        assert cluster.kubelet.end_pod("pod-a", "gpu.nvidia.com", [claim]) == []
        assert list(cluster.specs()) == [f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"]
        assert cluster.kubelet.end_pod("pod-b", "gpu.nvidia.com", [claim]) == [claim.uid]
        assert cluster.specs() == {}
        # a repeated prepare of a prepared claim answers the same (the kubelet may call again)
        schedule(cluster.api, claim)
        once = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        again = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        assert once == again and not once.error


def test_one_claims_error_does_not_fail_the_others(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        good = make_claim(cluster.api, "good")
        schedule(cluster.api, good)
        unallocated = make_claim(cluster.api, "waiting")
        other_uid = make_claim(cluster.api, "recreated")
        schedule(cluster.api, other_uid)
        cluster.api.merge_patch(claim_path("ns", "recreated"), {"metadata": {"uid": "uid-new"}})
        claims = [good, unallocated, other_uid, Claim("ns", "missing", "uid-missing")]
        answer = cluster.kubelet.node_prepare("gpu.nvidia.com", claims).claims
        assert not answer[good.uid].error and answer[good.uid].devices[0].device_name == "gpu-0"
        assert answer[unallocated.uid].error == "ResourceClaim ns/waiting is not allocated"
        assert answer[other_uid.uid].error == (
            "ResourceClaim ns/recreated has UID uid-new, not uid-recreated: deleted and created again?"
        )
        assert answer["uid-missing"].error == "ResourceClaim ns/missing not found"
        line = "claim not prepared claim=ns/waiting uid=uid-waiting"
        line += ' error="ResourceClaim ns/waiting is not allocated"'
        assert line in cluster.log()
        unprepared = cluster.kubelet.node_unprepare("gpu.nvidia.com", claims).claims
        assert {uid: r.error for uid, r in unprepared.items()} == {c.uid: "" for c in claims}
        assert cluster.process is not None and cluster.process.alive()


@pytest.mark.parametrize("api_version", ["v1beta1", "v1beta2"])
def test_a_1_32_kubelet_and_api_server_speak_v1beta1(tmp_path: Path, api_version: str) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.watcher.stop()
        cluster.watcher = PluginWatcher(
            cluster.node.registry, dra_services=("v1beta1.DRAPlugin",), health_services=()
        )
        cluster.watcher.start()
        cluster.kubelet.watcher = cluster.watcher
        cluster.api.put("/apis/resource.k8s.io", {"versions": [{"version": api_version}]})
        cluster.start()
        cluster.registered()
        assert cluster.watcher.plugins["gpu.nvidia.com"].service == "v1beta1.DRAPlugin"
        path = f"/apis/resource.k8s.io/{api_version}/resourceslices/node-a-gpu.nvidia.com-0"
        wait_until(lambda: path in cluster.api.objects, 5, "the slice")
        device = cluster.api.objects[path]["spec"]["devices"][0]
        assert ("basic" in device) == (api_version == "v1beta1")
        claim = make_claim(cluster.api, "old")
        obj = cluster.api.objects.pop(claim_path("ns", "old"))
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"}
        obj["status"] = {"allocation": {"devices": {"results": [result]}}}
        cluster.api.put(claim_path("ns", "old", api_version), obj)
        (device,) = cluster.kubelet.start_pod("pod-1", "gpu.nvidia.com", [claim])[claim.uid]
        assert device.device_name == "gpu-3"
