"""Per-GPU replica counts under one name and the shared-devices allocation policy, end to end:
`nvdp plugin` as a subprocess, the kubelet stand-in over real unix sockets."""

from __future__ import annotations

from pathlib import Path

from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin
from tests.builders import append_sim_event, sim_gpus

GPU = "nvidia.com/gpu"
MIXED = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 2, devices: [0, 1, 2, 3]}
    - {name: nvidia.com/gpu, replicas: 4, devices: [4, 5]}
    - {name: nvidia.com/gpu, replicas: 1, devices: [6]}
"""


def test_mixed_replica_counts_ids_packed_policy_allocate_and_health(
    sock_dir: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    u = [g.uuid for g in sim_gpus("dgx-a100")]
    config = sock_dir / "config.yaml"
    config.write_text(MIXED)
    events = sock_dir / "events"
    env = {"SHARED_DEVICES_ALLOCATION_POLICY": "packed", "NVDP_SIM_EVENTS": str(events)}
    processes.append(start_plugin(sock_dir, "sim:dgx-a100", config_file=config, env=env))
    kubelet.wait_for_registration(GPU, timeout=20)
    want = [f"{u[g]}::{n}" for g in range(4) for n in range(2)]
    want += [f"{u[g]}::{n}" for g in (4, 5) for n in range(4)] + [u[6], u[7]]
    devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == len(want), timeout=10)
    assert sorted(devices) == sorted(want)

    # The kubelet's view: GPU 4 has one replica in use, GPU 5 three, GPU 0 one.
    available = [
        i for i in want if i not in (f"{u[4]}::0", f"{u[5]}::0", f"{u[5]}::1", f"{u[5]}::2", f"{u[0]}::0")
    ]
    assert kubelet.preferred_allocation(GPU, available, [], 2) == [f"{u[4]}::1", f"{u[5]}::3"]
    # must_include counts as in use: the fullest GPU first, then ties to the GPU least taken from.
    chosen = kubelet.preferred_allocation(GPU, available, [f"{u[1]}::0"], 3)
    assert chosen == [f"{u[0]}::1", f"{u[1]}::0", f"{u[5]}::3"]

    response = kubelet.allocate(GPU, [[f"{u[4]}::1", f"{u[4]}::2", u[6]], [f"{u[0]}::1"]])
    envs = [dict(c.envs)["NVIDIA_VISIBLE_DEVICES"] for c in response.container_responses]
    assert envs == [f"{u[4]},{u[6]}", u[0]]

    append_sim_event(events, uuid=u[4], xid=79)
    sick = {f"{u[4]}::{n}" for n in range(4)}
    devices = kubelet.wait_for_devices(
        GPU, lambda d: any(s.health == "Unhealthy" for s in d.values()), timeout=10
    )
    assert {i for i, s in devices.items() if s.health == "Unhealthy"} == sick


def test_mig_default_policy_is_distributed(
    sock_dir: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    gpus = sim_gpus("dgx-a100-mig")
    small = [m.uuid for g in gpus for m in g.mig_devices if m.profile == "1g.5gb"]  # 7 on GPU 0, 1 on GPU 2
    processes.append(start_plugin(sock_dir, "sim:dgx-a100-mig", extra=["--mig-strategy", "mixed"]))
    kubelet.wait_for_registration("nvidia.com/mig-1g.5gb", timeout=20)
    assert kubelet.preferred_allocation("nvidia.com/mig-1g.5gb", small, [], 2) == [small[0], small[7]]
