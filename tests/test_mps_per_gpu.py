"""MPS with per-GPU replica counts (several `sharing.mps` entries of one name, disjoint devices,
different `replicas`): the control daemon's per-GPU pinned-memory limits, the per-container limits in
Allocate (through the kubelet stand-in) and the node refusal all use each GPU's own count, never the
resource's smallest one."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.config import ReplicatedResource, parse_text
from nvdp.node.gpus.devices import AnnotatedID
from nvdp.node.gpus.inventory import mps_misfits
from nvdp.node.gpus.resources import build_resources
from nvdp.node.mps.command import node_plans
from nvdp.node.mps.layout import MpsRoot
from nvdp.node.mps.plan import container_limit_envs
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim.backend import SimNvml
from nvdp.sim.kubelet import Kubelet
from testkit import start_plugin
from tests.builders import sim_gpus, with_facts

GPU = "nvidia.com/gpu"
L40S_MIB = 46068  # pcie-4: 4 x L40S
# GPUs 0-1 in 2 replicas, GPU 2 in 4, GPU 3 whole (selected by no entry).
PER_GPU = (
    "version: v1\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n"
    "    - {name: gpu, replicas: 2, devices: [0, 1]}\n"
    "    - {name: gpu, replicas: 4, devices: [2]}\n"
)


def test_daemon_limits_use_each_gpus_own_count() -> None:
    nvml = open_nvml("sim:pcie-4")
    assert isinstance(nvml, SimNvml)
    nvml.init()
    try:
        plan = node_plans(parse_text(PER_GPU), nvml)[GPU]
    finally:
        nvml.shutdown()
    assert [(g.index, g.replicas) for g in plan.gpus] == [(0, 2), (1, 2), (2, 4)]
    assert plan.limit_commands() == [
        f"set_default_device_pinned_mem_limit 0 {L40S_MIB // 2}M",
        f"set_default_device_pinned_mem_limit 1 {L40S_MIB // 2}M",
        f"set_default_device_pinned_mem_limit 2 {L40S_MIB // 4}M",
        # one default per daemon: the share of its most divided GPU
        "set_default_active_thread_percentage 25",
    ]


def test_container_limits_use_each_gpus_own_count() -> None:
    gpus = sim_gpus("pcie-4")
    sharing = (
        ReplicatedResource(GPU, 2, strategy="mps", devices=("0", "1")),
        ReplicatedResource(GPU, 4, strategy="mps", devices=("2",)),
    )
    (resource,) = build_resources(gpus, sharing=sharing).resources
    assert resource.replicas == 2  # the smallest: what the limits must not use
    devices = resource.devices

    def given(*ids: str) -> dict[str, str]:
        return container_limit_envs([devices[i] for i in ids], resource.replicas_of)

    u0, u2, u3 = gpus[0].uuid, gpus[2].uuid, gpus[3].uuid
    assert given(f"{u2}::1") == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={L40S_MIB // 4}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert given(f"{u0}::1", f"{u2}::0", f"{u2}::3") == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={L40S_MIB // 2}M,1={L40S_MIB // 2}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    assert given(u3) == {  # a whole GPU under the MPS name is given whole
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={L40S_MIB}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    }


def test_allocate_limits_follow_each_gpus_count(sock_dir: Path, kubelet: Kubelet, tmp_path: Path) -> None:
    root = MpsRoot(tmp_path / "mps")
    root.resource_dir(GPU).mkdir(parents=True)
    root.marker(GPU).touch()  # as the control daemon does once it is ready
    config = tmp_path / "config.yaml"
    config.write_text(PER_GPU)
    plugin = start_plugin(sock_dir, "sim:pcie-4", config_file=config, extra=["--mps-root", str(root.path)])
    with plugin:
        kubelet.wait_for_registration(GPU, timeout=20)
        ids = kubelet.wait_for_devices(GPU, lambda d: len(d) == 2 * 2 + 4 + 1, timeout=10)
        counts: dict[str, int] = {}
        for device_id in ids:
            uuid = AnnotatedID.parse(device_id).uuid
            counts[uuid] = counts.get(uuid, 0) + 1
        gpus = sim_gpus("pcie-4")
        assert [counts[g.uuid] for g in gpus] == [2, 2, 4, 1]
        two, four = kubelet.allocate(
            GPU, [[f"{gpus[0].uuid}::0"], [f"{gpus[2].uuid}::0"]]
        ).container_responses
        assert two.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={L40S_MIB // 2}M"
        assert two.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert four.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={L40S_MIB // 4}M"
        assert four.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "Traceback" not in plugin.log()


@pytest.mark.parametrize(
    ("replicas", "refused"),
    [
        pytest.param(
            (4, 20),
            "sharing.mps: nvidia.com/gpu: 20 replicas are more than MPS supports on GPU 1 "
            "(compute capability 7.0: 16 clients); not advertised",
            id="the-larger-count-on-volta",
        ),
        pytest.param((16, 4), None, id="both-within-16"),
    ],
)
def test_volta_client_limit_is_per_gpu(replicas: tuple[int, int], refused: str | None) -> None:
    volta = [with_facts(g, compute_capability=(7, 0)) for g in sim_gpus("pcie-4")[:2]]
    sharing = (
        ReplicatedResource(GPU, replicas[0], strategy="mps", devices=("0",)),
        ReplicatedResource(GPU, replicas[1], strategy="mps", devices=("1",)),
    )
    resources = build_resources(volta, sharing=sharing).resources
    misfits = mps_misfits(resources, volta)
    assert [m.message for m in misfits] == ([] if refused is None else [refused])
    assert all(m.withholds == (GPU,) for m in misfits)
