"""Extended resources through DRA (KEP-5004): an unmodified pod asking `nvidia.com/gpu: 1` is served by
`nvdp dra-kubelet-plugin` on a node whose GPUs are DRA's, through the `gpu.nvidia.com` DeviceClass's
`extendedResourceName`. The stand-in scheduler makes the claim the real one makes, the kubelet stand-in
prepares it with the plugin (a process) and gives the container the claim's CDI devices. While the
device plugin advertises `nvidia.com/gpu` on the node (its allocatable > 0), the device plugin serves
the pod and no claim is made."""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from nvdp.sim.dra.scheduler import (
    AllocationError,
    extended_resource_claim,
    extended_resource_classes,
    nvidia_device_classes,
)
from nvdp.sim.kubelet import Kubelet
from nvdp.sim.kubelet.dra import Claim
from testkit import start_plugin, wait_until
from tests.builders import sim_gpus
from tests.dra_support import DRIVER, V1, claim_path, dra_cluster, published, schedule, slices_of
from tests.kube_api_standin import KubeApiStandin

GPU = "nvidia.com/gpu"
GPUS = [g.uuid for g in sim_gpus("pcie-4")]
CLASSES = nvidia_device_classes(extended_resource_name=GPU)  # NVIDIA's chart's, resource.k8s.io/v1
DRA_NODE: dict[str, Any] = {"status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def pod_asking(
    name: str, *containers: tuple[str, dict[str, Any]], init: tuple[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A pod whose containers have these `limits` (requests left to the API server's defaulting)."""
    spec: dict[str, Any] = {
        "containers": [{"name": n, "resources": {"limits": lim}} for n, lim in containers]
    }
    if init is not None:
        spec["initContainers"] = [{"name": init[0], "resources": {"limits": init[1]}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"pod-uid-{name}"},
        "spec": spec,
    }


TRAIN = pod_asking("train", ("main", {GPU: 1}), ("sidecar", {"cpu": "100m"}))


# ---- the scheduler's claim (pure) ----------------------------------------------------------------------


def test_the_claim_the_scheduler_makes() -> None:
    asked = pod_asking(
        "big",
        ("main", {"cpu": "4", "memory": "8Gi", GPU: 2}),
        ("log", {"cpu": "100m"}),
        init=("fetch", {GPU: "1"}),
    )
    claim, status = extended_resource_claim(asked, CLASSES, DRA_NODE) or ({}, {})
    name = claim["metadata"]["name"]
    assert name.startswith("big-extended-resources-") and len(name) == len("big-extended-resources-") + 5
    assert claim["metadata"] == {
        "name": name,
        "generateName": "big-extended-resources-",
        "namespace": "ml",
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "big",
                "uid": "pod-uid-big",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    exactly = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount"}
    assert claim["spec"]["devices"]["requests"] == [
        {"name": "container-0-request-0", "exactly": {**exactly, "count": 1}},  # the init container
        {"name": "container-1-request-2", "exactly": {**exactly, "count": 2}},  # cpu, memory, nvidia.com/gpu
    ]
    assert status == {
        "requestMappings": [
            {"containerName": "fetch", "resourceName": GPU, "requestName": "container-0-request-0"},
            {"containerName": "main", "resourceName": GPU, "requestName": "container-1-request-2"},
        ],
        "resourceClaimName": name,
    }


@pytest.mark.parametrize(
    ("allocatable", "classes", "made"),
    [
        ({GPU: "4"}, CLASSES, False),
        ({GPU: "0"}, CLASSES, True),
        ({}, CLASSES, True),
        ({}, nvidia_device_classes(), False),
    ],
    ids=[
        "device-plugin-advertises-it",
        "device-plugin-advertises-none",
        "no-device-plugin",
        "class-without-name",
    ],
)
def test_a_claim_only_where_no_device_plugin_serves_the_resource(
    allocatable: dict[str, str], classes: dict[str, Any], made: bool
) -> None:
    node = {"status": {"allocatable": {"cpu": "64", **allocatable}}}
    assert (extended_resource_claim(TRAIN, classes, node) is not None) == made


def test_every_class_serves_its_implicit_name_and_the_newest_class_wins() -> None:
    classes = copy.deepcopy(CLASSES)
    classes["gpu.nvidia.com"]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    for name, created in (("b-gpus", "2026-02-01T00:00:00Z"), ("a-gpus", "2026-02-01T00:00:00Z")):
        classes[name] = {
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"extendedResourceName": GPU},
        }
    served = extended_resource_classes(classes)
    assert served[GPU] == "a-gpus"  # the newest two: the name sorted first
    assert served["deviceclass.resource.kubernetes.io/mig.nvidia.com"] == "mig.nvidia.com"
    mig = pod_asking("mig", ("main", {"deviceclass.resource.kubernetes.io/mig.nvidia.com": 1}))
    claim, _ = extended_resource_claim(mig, classes, DRA_NODE) or ({}, {})
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "mig.nvidia.com"


def test_a_quantity_that_is_not_whole_is_refused() -> None:
    with pytest.raises(AllocationError) as error:
        extended_resource_claim(pod_asking("half", ("main", {GPU: "500m"})), CLASSES, DRA_NODE)
    assert str(error.value) == "extended resource quantity '500m': only whole numbers are supported"


# ---- end to end: the plugin as a process, the API and kubelet stand-ins -----------------------------------


def ml_pod_path(name: str) -> str:
    return f"/api/v1/namespaces/ml/pods/{name}"


def schedule_pod(
    api: KubeApiStandin, asked: dict[str, Any], allocatable: dict[str, str]
) -> tuple[Claim, dict[str, Any]] | None:
    """Play the scheduler for a pod (KEP-5004): when the node's allocatable lacks the resource, create the
    claim, allocate it, reserve it for the pod and write the pod's extendedResourceClaimStatus. The claim
    and the pod as the kubelet then reads it; None when no claim is needed (the device plugin's turn)."""
    classes = {
        o["metadata"]["name"]: o for p, o in api.objects.items() if p.startswith(f"{V1}/deviceclasses/")
    }
    made = extended_resource_claim(asked, classes, {"status": {"allocatable": allocatable}})
    if made is None:
        return None
    claim, status = made
    metadata = claim["metadata"]
    metadata["uid"] = f"uid-{metadata['name']}"  # the API server's
    api.put(claim_path("ml", metadata["name"]), claim)
    ref = Claim("ml", metadata["name"], metadata["uid"])
    schedule(api, ref)
    reserved = [{"resource": "pods", "name": asked["metadata"]["name"], "uid": asked["metadata"]["uid"]}]
    api.merge_patch(claim_path("ml", ref.name), {"status": {"reservedFor": reserved}})
    api.put(ml_pod_path(asked["metadata"]["name"]), asked)
    scheduled = api.merge_patch(
        ml_pod_path(asked["metadata"]["name"]), {"status": {"extendedResourceClaimStatus": status}}
    )
    assert scheduled is not None
    return ref, scheduled


def serve_extended_resource(api: KubeApiStandin) -> None:
    api.put(f"{V1}/deviceclasses/gpu.nvidia.com", CLASSES["gpu.nvidia.com"])


def test_a_pod_asking_nvidia_com_gpu_is_served_by_the_dra_plugin(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:  # the config gives DRA every GPU; no device plugin
        serve_extended_resource(cluster.api)
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")

        scheduled = schedule_pod(cluster.api, TRAIN, {})
        assert scheduled is not None
        claim, train = scheduled
        stored = cluster.api.objects[claim_path("ml", claim.name)]
        assert stored["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
        assert [
            (r["request"], r["device"]) for r in stored["status"]["allocation"]["devices"]["results"]
        ] == [("container-0-request-0", "gpu-0")]

        devices = cluster.kubelet.start_extended_resource_pod(train, claim.uid, DRIVER)
        cdi = f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-0"
        assert devices == {"main": [cdi], "sidecar": []}
        spec = cluster.specs()[f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"]
        (device,) = spec["devices"]
        assert device["name"] == f"{claim.uid}-gpu-0"
        assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]
        assert json.loads(cluster.node.checkpoint.read_text())["claims"][claim.uid]["devices"][0][
            "request_names"
        ] == ["container-0-request-0"]

        assert cluster.kubelet.end_pod(train["metadata"]["uid"], DRIVER, [claim]) == [claim.uid]
        assert not cluster.specs()


def healthy_gpus_listed(kubelet: Kubelet) -> list[str]:
    if GPU not in kubelet.resources():
        return []
    return sorted(i for i, d in kubelet.devices(GPU).items() if d.health == "Healthy")


def test_the_device_plugin_serves_nvidia_com_gpu_while_it_advertises_it(tmp_path: Path) -> None:
    """One GPU, one API: the device plugin and the DRA plugin on one node. While the device plugin
    advertises GPUs (the node's allocatable nvidia.com/gpu > 0) a pod asking nvidia.com/gpu is the device
    plugin's; once the config gives DRA every GPU, the next such pod gets a DRA claim."""
    split = "version: v1\ndra:\n  devices: [2, 3]\n"
    with dra_cluster(tmp_path, config=split) as cluster:
        serve_extended_resource(cluster.api)
        plugin_dir = cluster.node.root / "device-plugins"  # beside plugins/: the records are found
        kubelet = Kubelet(plugin_dir, pod_resources=True)
        kubelet.start()
        config = Path(cluster.env["CONFIG_FILE"])
        plugin = start_plugin(plugin_dir, cluster.nvml, config_file=config, log_path=tmp_path / "plugin.log")
        try:
            dra = cluster.start()
            cluster.registered()
            wait_until(
                lambda: healthy_gpus_listed(kubelet) == sorted(GPUS[:2]), 20, "GPUs 0, 1 by the device plugin"
            )
            wait_until(lambda: sorted(published(cluster.api)) == ["gpu-2", "gpu-3"], 20, "GPUs 2, 3 by DRA")

            allocatable = {GPU: str(len(healthy_gpus_listed(kubelet)))}
            assert schedule_pod(cluster.api, TRAIN, allocatable) is None  # the device plugin's pod
            (held,) = kubelet.admit_pod("ml", "train", {"main": {GPU: 1}}).assignments[0].device_ids
            assert held in GPUS[:2]
            kubelet.remove_pod("ml", "train")

            config.write_text("version: v1\ndra:\n  devices: all\n")  # the config-manager's switch
            for process in (plugin, dra):
                process.send(signal.SIGHUP)
            wait_until(lambda: not healthy_gpus_listed(kubelet), 20, "the device plugin advertises no GPU")
            wait_until(lambda: len(published(cluster.api)) == 4, 20, "every GPU by DRA")

            scheduled = schedule_pod(cluster.api, pod_asking("next", ("main", {GPU: 1})), {GPU: "0"})
            assert scheduled is not None
            claim, next_pod = scheduled
            (cdi,) = cluster.kubelet.start_extended_resource_pod(next_pod, claim.uid, DRIVER)["main"]
            assert cdi.startswith(f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-")
        finally:
            plugin.stop()
            kubelet.stop()
