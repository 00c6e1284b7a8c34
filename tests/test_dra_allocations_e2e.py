"""A node split between the APIs, as processes: `nvdp plugin` (kubelet stand-in with PodResources,
metrics endpoint) serves GPUs 0 and 1, `nvdp dra-kubelet-plugin` GPUs 2 and 3. The device plugin's
/allocations and `nvdp status` list the DRA GPUs too (under gpu.nvidia.com): which claim and pod
holds each, and its share (an MPS claim's limits); the DRA plugin's allocations file follows
unprepare and goes when it stops."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nvdp.sim.kubelet import Kubelet
from testkit import free_port, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.dra_support import DRIVER, claim_path, dra_cluster, make_claim, schedule
from tests.mps_standin import Standin
from tests.readings import http_get, status_lines
from tests.test_dra_state import reserve

GPU = "nvidia.com/gpu"
UUIDS = [g.uuid for g in sim_gpus("pcie-4")]
SPLIT = "version: v1\ndra:\n  devices: [2, 3]\n"
MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}


def test_the_device_plugins_allocations_show_the_dra_gpus(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    with dra_cluster(
        tmp_path,
        config=SPLIT,
        env=standin.env({"PATH": os.environ["PATH"], "MPS_ROOT": str(tmp_path / "mps")}),
    ) as cluster:
        kubelet = Kubelet(cluster.node.root / "device-plugins", pod_resources=True)
        kubelet.start()
        port = free_port()
        plugin = start_plugin(
            cluster.node.root / "device-plugins",
            cluster.nvml,
            config_file=Path(cluster.env["CONFIG_FILE"]),
            metrics_address=f"127.0.0.1:{port}",
            log_path=tmp_path / "plugin.log",
        )
        try:
            cluster.start()
            cluster.registered()
            kubelet.wait_for_registration(GPU, timeout=20)

            def dra_devices() -> dict[str, Any]:
                status, body = http_get(port, "/allocations")
                assert status == 200, body
                return {d["device"]: d for d in json.loads(body)["resources"].get(DRIVER, [])}

            wait_until(lambda: set(dra_devices()) == {"gpu-2", "gpu-3"}, 20, "the DRA GPUs listed")
            kubelet.admit_pod("ml", "plain", {"main": {GPU: 1}})
            claim = make_claim(cluster.api, "train", namespace="ml")
            config = [{"opaque": {"driver": DRIVER, "parameters": MPS}}]
            cluster.api.merge_patch(claim_path("ml", "train"), {"spec": {"devices": {"config": config}}})
            assert schedule(cluster.api, claim) == ["gpu-2"]
            reserve(cluster.api, claim, "train-0")
            cluster.kubelet.start_pod("uid-train-0", DRIVER, [claim])
            wait_until(lambda: dra_devices()["gpu-2"]["pods"], 10, "the claim's pod listed")
            gpu2 = dra_devices()["gpu-2"]
            assert {k: gpu2[k] for k in ("gpu", "index", "advertised", "health", "share")} == {
                "gpu": UUIDS[2],
                "index": "2",
                "advertised": True,
                "health": "Healthy",
                "share": "MPS: 50% of the threads",
            }
            assert gpu2["claims"] == [{"namespace": "ml", "name": "train", "uid": claim.uid}]
            assert gpu2["pods"] == [
                {
                    "namespace": "ml",
                    "name": "train-0",
                    "uid": "uid-train-0",
                    "container": "",
                    "claim": "ml/train",
                }
            ]
            assert dra_devices()["gpu-3"]["pods"] == []

            lines = status_lines(port)
            assert f"{GPU}  2 devices: 1 held, 0 not healthy, 1 free" in lines
            assert f"{DRIVER}  2 devices: 1 held, 0 not healthy, 1 free" in lines
            (row,) = [line for line in lines if line.startswith("  gpu-2 ")]
            assert row.split() == ["gpu-2", "2", "Healthy", "ml/train-0", "(claim", "ml/train)"]
            assert lines[lines.index(row) + 1].split() == ["share:", "MPS:", "50%", "of", "the", "threads"]

            cluster.kubelet.end_pod("uid-train-0", DRIVER, [claim])
            wait_until(lambda: not dra_devices()["gpu-2"]["claims"], 10, "the claim gone")
            assert "share" not in dra_devices()["gpu-2"]
            allocations = cluster.node.plugins / DRIVER / "allocations.json"
            assert allocations.exists()
            assert cluster.process is not None
            cluster.process.stop()
            assert not allocations.exists()
            assert dra_devices() == {}
        finally:
            plugin.stop()
            kubelet.stop()
