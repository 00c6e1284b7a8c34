"""An XID on a GPU a DRA claim holds, as the device plugin reports one on a GPU a pod holds: the log
line and the Node event name the claim and its pods, and each pod gets a Warning event of its own.
`nvdp dra-kubelet-plugin` as a process, the kubelet stand-in, the API stand-in (which records the
Events), NVML events injected into the simulated node."""

from __future__ import annotations

from pathlib import Path

from testkit import wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.dra_support import DRIVER, claim_path, dra_cluster, make_claim, schedule, slices_of
from tests.test_dra_state import reserve


def test_an_xid_names_the_claims_and_pods_it_hits(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.touch()
    gpu0, gpu1 = (g.uuid for g in sim_gpus("pcie-4")[:2])
    with dra_cluster(tmp_path, env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        held, idle = make_claim(cluster.api, "held"), make_claim(cluster.api, "idle")
        assert [schedule(cluster.api, c) for c in (held, idle)] == [["gpu-0"], ["gpu-1"]]
        reserve(cluster.api, held, "pod-a")
        cluster.kubelet.start_pod("uid-pod-a", DRIVER, [held])
        path = claim_path("ns", "held")
        wait_until(lambda: cluster.api.count("GET", path) >= 2, 5, "the claim's pods read")

        append_sim_event(events, uuid=gpu0, xid=79)
        append_sim_event(events, uuid=gpu1, xid=79)  # no claim prepared on it: no pod named
        line = f"device unhealthy resource=gpu.nvidia.com device={gpu0} index=0 xid=79"
        wait_until(lambda: line in cluster.log(), 5, "the transition logged")
        wait_until(lambda: cluster.api.events("Pod", "pod-a", "ns"), 5, "the pod's event")
        (event,) = cluster.api.events("Pod", "pod-a", "ns")
        assert (event["type"], event["reason"]) == ("Warning", "GPUUnhealthy")
        assert event["involvedObject"]["uid"] == "uid-pod-a"
        message = event["message"]
        assert message.startswith(f"GPU 0 ({gpu0}) is unhealthy since ")
        assert (
            "This pod holds gpu.nvidia.com gpu-0 on it through ResourceClaim ns/held. nvdp does not"
            in message
        )

        wait_until(lambda: len(cluster.api.events("Node", "node-a")) >= 2, 5, "the Node events")
        by_gpu = {
            e["message"].split("device=")[1].split()[0]: e["message"] for e in cluster.api.events("Node")
        }
        assert by_gpu[gpu0].endswith("claims=ns/held pods=ns/pod-a")
        assert "claims=" not in by_gpu[gpu1] and "pods=" not in by_gpu[gpu1]
        log_line = next(x for x in cluster.log().splitlines() if line in x)
        assert log_line.endswith("claims=ns/held pods=ns/pod-a")
        assert "Traceback" not in cluster.log()
