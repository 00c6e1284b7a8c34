"""Claims that say how to share, end to end: `nvdp dra-kubelet-plugin` as a process on a simulated node,
the kubelet stand-in over its socket, the API stand-in and the stand-in scheduler copying the
DeviceClass's and the claim's configs into the allocation, and the `nvidia-cuda-mps-control`
stand-in on PATH. TimeSlicing from the class, overridden by the claim; MPS with its limits in the
claim's CDI spec; a bad config refused for its claim alone; everything undone at unprepare."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nvdp.sim.kubelet.dra import Claim
from testkit import wait_until
from tests.builders import sim_gpus
from tests.cdi_support import load_schema, validate
from tests.dra_support import V1, claim_path, dra_cluster, make_claim, schedule, slices_of
from tests.mps_standin import Standin

GPUS = [g.uuid for g in sim_gpus("pcie-4")]
DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"


def config_for(parameters: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": DRIVER, "parameters": parameters}}
    return {**entry, "requests": requests} if requests else entry


def sharing(strategy: str, **settings: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": strategy, **settings}}


def with_config(cluster: Any, claim: Claim, *config: dict[str, Any]) -> Claim:
    cluster.api.merge_patch(
        claim_path(claim.namespace, claim.name), {"spec": {"devices": {"config": list(config)}}}
    )
    return claim


def started_with_an_mps_claim(cluster: Any) -> Claim:
    """The plugin started and registered, an MPS claim made, scheduled and prepared (no error)."""
    cluster.start()
    cluster.registered()
    wait_until(lambda: slices_of(cluster.api), 5, "the slice")
    mps = with_config(cluster, make_claim(cluster.api, "mps"), config_for(sharing("MPS")))
    schedule(cluster.api, mps)
    assert cluster.kubelet.node_prepare(DRIVER, [mps]).claims[mps.uid].error == ""
    return mps


def test_time_slicing_and_mps_claims(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    env = standin.env({"PATH": os.environ["PATH"], "MPS_ROOT": str(tmp_path / "mps-root")})
    with dra_cluster(tmp_path, env=env) as cluster:
        short = sharing("TimeSlicing", timeSlicingConfig={"interval": "Short"})
        cluster.api.put(
            f"{V1}/deviceclasses/gpu-short.nvidia.com",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu-short.nvidia.com"},
                "spec": {
                    "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
                    "config": [config_for(short)],
                },
            },
        )
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")

        sliced = make_claim(cluster.api, "sliced", "gpu-short.nvidia.com")  # the class's Short
        longer = with_config(
            cluster,
            make_claim(cluster.api, "longer", "gpu-short.nvidia.com"),
            config_for(sharing("TimeSlicing", timeSlicingConfig={"interval": "Long"}), ["gpu"]),
        )
        limits = {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "8Gi",
            "defaultPerDevicePinnedMemoryLimit": {"0": "4Gi"},
        }
        mps = with_config(
            cluster, make_claim(cluster.api, "mps"), config_for(sharing("MPS", mpsConfig=limits))
        )
        bad = with_config(
            cluster, make_claim(cluster.api, "bad"), config_for({"apiVersion": API, "kind": "TpuConfig"})
        )
        claims = [sliced, longer, mps, bad]
        assert [schedule(cluster.api, c) for c in claims] == [["gpu-0"], ["gpu-1"], ["gpu-2"], ["gpu-3"]]
        answers = cluster.kubelet.node_prepare(DRIVER, claims).claims
        assert answers[bad.uid].error == (
            "ResourceClaim ns/bad: a gpu.nvidia.com config's kind 'TpuConfig' is not GpuConfig or "
            "MigDeviceConfig"
        )
        assert [answers[c.uid].error for c in claims[:3]] == ["", "", ""]

        log = cluster.log()
        assert f"simulated compute mode set gpu={GPUS[0]} mode=DEFAULT" in log
        assert f"simulated time slice set gpu={GPUS[0]} interval=Short smi_level=1" in log
        assert f"simulated time slice set gpu={GPUS[1]} interval=Long smi_level=3" in log
        assert f"simulated compute mode set gpu={GPUS[2]} mode=EXCLUSIVE_PROCESS" in log
        pipe = tmp_path / "mps-root" / DRIVER / GPUS[2] / "pipe"  # the MPS root's layout
        assert standin.running(pipe)
        assert {c["visible"] for c in standin.calls()} == {GPUS[2]}

        spec = cluster.specs()[f"k8s.gpu.nvidia.com-claim_{mps.uid}.json"]
        (device,) = spec["devices"]
        assert device["containerEdits"]["env"] == [
            f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPUS[2]}=4096M",  # keyed by UUID, as NVIDIA's driver
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        ]
        options = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
        assert device["containerEdits"]["mounts"] == [
            {"hostPath": str(pipe), "containerPath": str(pipe), "options": options},
            {"hostPath": str(tmp_path / "mps-root/shm"), "containerPath": "/dev/shm", "options": options},
        ]
        assert validate(spec, load_schema(), strict=False) == []
        sliced_spec = cluster.specs()[f"k8s.gpu.nvidia.com-claim_{sliced.uid}.json"]
        assert "env" not in sliced_spec["devices"][0]["containerEdits"]
        sliced_gpus = json.loads((cluster.node.plugins / DRIVER / "timeslices.json").read_text())
        assert sliced_gpus == {GPUS[0]: sliced.uid, GPUS[1]: longer.uid}

        unprepared = cluster.kubelet.node_unprepare(DRIVER, claims[:3]).claims
        assert [unprepared[c.uid].error for c in claims[:3]] == ["", "", ""]
        log = cluster.log()
        for gpu in GPUS[:2]:
            assert f"simulated time slice set gpu={gpu} interval=Default smi_level=0" in log
        assert not standin.running(pipe)
        assert standin.commands(pipe)[-1] == "quit"
        assert f"simulated compute mode set gpu={GPUS[2]} mode=DEFAULT" in log
        assert json.loads((cluster.node.plugins / DRIVER / "timeslices.json").read_text()) == {}
        assert "Traceback" not in log


def test_a_simulated_node_without_the_control_binary_runs_no_daemon(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "MPS_ROOT": str(tmp_path / "mps-root")}
    with dra_cluster(tmp_path, env=env) as cluster:
        mps = started_with_an_mps_claim(cluster)
        marker = tmp_path / "mps-root" / DRIVER / GPUS[0] / ".started"
        assert marker.exists()
        assert "simulated node: no MPS control daemon started; its ready marker written" in cluster.log()
        assert f"simulated compute mode set gpu={GPUS[0]}" not in cluster.log()
        assert cluster.kubelet.node_unprepare(DRIVER, [mps]).claims[mps.uid].error == ""
        assert not marker.exists()


def test_an_mps_claims_daemon_quits_with_the_plugin_and_comes_back(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    env = standin.env({"PATH": os.environ["PATH"], "MPS_ROOT": str(tmp_path / "mps-root")})
    with dra_cluster(tmp_path, env=env) as cluster:
        mps = started_with_an_mps_claim(cluster)
        pipe = tmp_path / "mps-root" / DRIVER / GPUS[0] / "pipe"
        assert standin.running(pipe)
        assert cluster.process is not None
        cluster.process.stop()
        assert not standin.running(pipe)
        assert f"simulated compute mode set gpu={GPUS[0]} mode=DEFAULT" in cluster.log()
        cluster.start()
        cluster.registered(after=1)
        wait_until(lambda: standin.running(pipe), 10, "the daemon started again")
        assert cluster.log().count(f"starting MPS daemon daemon={GPUS[0]}") == 2
        assert cluster.kubelet.node_unprepare(DRIVER, [mps]).claims[mps.uid].error == ""
        assert not standin.running(pipe)


def test_a_holders_record_of_claims_gone_from_the_node_starts_no_daemon(tmp_path: Path) -> None:
    """A reinstall over MPS records that outlived their claims (the host's /run kept them, the new
    checkpoint lists none): no daemon, no GPU made exclusive, the record emptied, one WARNING."""
    standin = Standin(tmp_path / "standin")
    env = standin.env({"PATH": os.environ["PATH"], "MPS_ROOT": str(tmp_path / "mps-root")})
    daemon = tmp_path / "mps-root" / DRIVER / GPUS[0]
    (daemon / "pipe").mkdir(parents=True)
    record = daemon / "holders.json"
    record.write_text(json.dumps({"gpus": [GPUS[0]], "holders": ["uid-gone"], "kept": False}))
    with dra_cluster(tmp_path, env=env) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: "names claims not prepared here" in cluster.log(), 10, "the WARNING")
        assert f"daemon={GPUS[0]} claims=uid-gone" in cluster.log()
        assert json.loads(record.read_text())["holders"] == []
        assert not standin.running(daemon / "pipe")
        assert "starting MPS daemon" not in cluster.log()
        assert f"simulated compute mode set gpu={GPUS[0]}" not in cluster.log()
