"""`nvdp dra-kubelet-plugin` and device health, as a process with injected NVML events: an XID keeps
the device from the next claim (tainted in the slice, skipped by the scheduler, refused by prepare,
Unhealthy in the kubelet's resource-health stream), or withdraws it where the API server drops
taints; a MIG re-partition and a restart between prepare and unprepare."""

from __future__ import annotations

import json
import time
from pathlib import Path

from testkit import wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.dra_support import claim_path, dra_cluster, make_claim, published, schedule, slices_of


def test_an_xid_keeps_the_device_from_the_next_claim(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.touch()
    gpu0 = sim_gpus("pcie-4")[0].uuid
    with dra_cluster(tmp_path, env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        cluster.kubelet.watch_health("gpu.nvidia.com")
        cluster.kubelet.wait_for_health("gpu.nvidia.com", "gpu-0", True, 5)
        before = make_claim(cluster.api, "before")
        assert schedule(cluster.api, before) == ["gpu-0"]
        cluster.kubelet.start_pod("pod-0", "gpu.nvidia.com", [before])

        append_sim_event(events, uuid=gpu0, xid=79)
        wait_until(lambda: published(cluster.api)["gpu-0"].get("taints"), 5, "gpu-0 tainted")
        (taint,) = published(cluster.api)["gpu-0"]["taints"]
        assert {k: taint[k] for k in ("key", "value", "effect")} == {
            "key": "gpu.nvidia.com/unhealthy",
            "value": "xid-79",
            "effect": "NoSchedule",
        }
        health = cluster.kubelet.wait_for_health("gpu.nvidia.com", "gpu-0", False, 5)
        assert "79" in health.message
        assert all(cluster.kubelet.health["gpu.nvidia.com"][f"gpu-{n}"].health == 1 for n in (1, 2, 3))

        after = make_claim(cluster.api, "after")
        assert schedule(cluster.api, after) == ["gpu-1"]  # the scheduler keeps off the tainted device
        forced = make_claim(cluster.api, "forced")
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
        cluster.api.merge_patch(
            claim_path("ns", "forced"), {"status": {"allocation": {"devices": {"results": [result]}}}}
        )
        answer = cluster.kubelet.node_prepare("gpu.nvidia.com", [forced, after]).claims
        assert answer[forced.uid].error == "device gpu-0 is Unhealthy (xid-79); not handed to a new claim"
        assert answer[after.uid].devices[0].device_name == "gpu-1"
        # the claim prepared before the XID keeps its answer (its pod runs on)
        again = cluster.kubelet.node_prepare("gpu.nvidia.com", [before]).claims[before.uid]
        assert not again.error and again.devices[0].device_name == "gpu-0"
        log = cluster.log()
        assert f"device unhealthy resource=gpu.nvidia.com device={gpu0} index=0 xid=79" in log
        assert log.count("Unhealthy devices shown as device taints in the ResourceSlice") == 1
        assert "kubelet watches device health service=v1.DRAResourceHealth" in log


def test_where_taints_are_dropped_an_unhealthy_device_is_withdrawn(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.touch()
    gpu1 = sim_gpus("pcie-4")[1].uuid
    with dra_cluster(tmp_path, env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        cluster.api.drop_device_taints = True
        cluster.start()
        cluster.registered()
        wait_until(lambda: len(published(cluster.api)) == 4, 5, "four devices")
        append_sim_event(events, uuid=gpu1, xid=48)
        wait_until(lambda: list(published(cluster.api)) == ["gpu-0", "gpu-2", "gpu-3"], 5, "gpu-1 withdrawn")
        claims = [make_claim(cluster.api, f"c{n}") for n in range(3)]
        assert [schedule(cluster.api, c) for c in claims] == [["gpu-0"], ["gpu-2"], ["gpu-3"]]
        assert "Unhealthy devices withdrawn from the ResourceSlice" in cluster.log()


def test_a_mig_repartition_is_published_within_a_second_or_so(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.touch()
    gpu0 = sim_gpus("dgx-a100-mig")[0].uuid
    with dra_cluster(tmp_path, "sim:dgx-a100-mig", env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: "gpu-0-mig-1g5gb-19-0" in published(cluster.api), 5, "the slice")
        generation = slices_of(cluster.api)[0]["spec"]["pool"]["generation"]
        append_sim_event(events, uuid=gpu0, mig=["3g.20gb", "3g.20gb"])
        changed = time.monotonic()
        wait_until(lambda: "gpu-0-mig-3g20gb-9-4" in published(cluster.api), 5, "the new layout")
        assert time.monotonic() - changed < 3.0  # 0.5 s rescan interval, plus a loaded machine's slack
        names = [n for n in published(cluster.api) if n.startswith("gpu-0-")]
        assert names == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]
        assert slices_of(cluster.api)[0]["spec"]["pool"]["generation"] == generation + 1
        append_sim_event(events, uuid=gpu0, mig=None)  # MIG off: the whole GPU is offered
        wait_until(lambda: "gpu-0" in published(cluster.api), 5, "the whole GPU")
        assert "MIG layout changed gpu=0" in cluster.log()


def test_a_restart_between_prepare_and_unprepare(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        claim = make_claim(cluster.api, "kept")
        schedule(cluster.api, claim)
        first = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        process.kill()  # no clean stop
        del cluster.api.objects[claim_path("ns", "kept")]  # an answer now can only come from the checkpoint
        stray = cluster.node.cdi / "k8s.gpu.nvidia.com-claim_uid-stray.json"
        stray.write_text("{}")  # a spec written just before a crash, never checkpointed
        cluster.start()
        cluster.registered(after=1)
        wait_until(lambda: not stray.exists(), 5, "the stray spec removed")
        again = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        assert again == first and not again.error
        unprepared = cluster.kubelet.node_unprepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        assert unprepared.error == ""
        assert cluster.specs() == {}
        assert json.loads(cluster.node.checkpoint.read_text())["claims"] == {}
