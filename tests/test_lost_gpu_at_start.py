"""A GPU lost before the plugin starts (simulated node file `lost:`): the other GPUs are served, the
lost one is advertised Unhealthy with the reason, and only policy decides whether it ever recovers."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.node.health import HealthMonitor
from nvdp.node.health.types import HealthChange
from nvdp.node.nvml.sim import SimNvml, load_node_file, open_sim
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until

GPU = "nvidia.com/gpu"
NODE = "gpus:\n  - {name: NVIDIA A100-SXM4-40GB, count: 4, lost: [false, true, false, false]}\n"


def node_file(tmp_path: Path, text: str = NODE) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return path


def test_node_file_lost_field_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_node_file(node_file(tmp_path, "gpus:\n  - {name: Tesla T4, count: 2, lost: [true]}\n"))
    assert "gpus[0].lost: must be a list of 2 entries (one per GPU), got [True]" in str(info.value)
    node = load_node_file(node_file(tmp_path, "gpus:\n  - {name: Tesla T4, count: 2, lost: true}\n"))
    assert [g.lost for g in node.gpus] == [True, True]


def test_sim_lists_a_gpu_lost_at_start_with_its_fault(tmp_path: Path) -> None:
    nvml = open_sim(str(node_file(tmp_path)))
    nvml.init()
    try:
        gpus = nvml.gpus()
        assert [g.fault is None for g in gpus] == [True, False, True, True]
        assert gpus[1].memory_bytes == 0 and gpus[1].minor == 1
        assert gpus[1].fault == (
            f"nvmlDeviceGetMemoryInfo failed: NVML_ERROR_GPU_IS_LOST device={gpus[1].uuid}: GPU is lost"
        )
        nvml.inject({"uuid": gpus[1].uuid, "event": "gpu-restored"})
        assert nvml.gpus()[1].fault is None, "listed with its facts once it answers"
    finally:
        nvml.shutdown()


def test_monitor_holds_a_faulty_gpu_unhealthy_and_fatal(tmp_path: Path) -> None:
    nvml: SimNvml = open_sim(str(node_file(tmp_path)))
    nvml.init()
    changes: list[HealthChange] = []
    gpus = nvml.gpus()
    monitor = HealthMonitor(nvml, gpus, changes.extend, wait_timeout=0.01)
    monitor.start()
    try:
        assert monitor.unhealthy() == {gpus[1].uuid: True}
        assert changes[0].uuid == gpus[1].uuid and not changes[0].healthy
        assert changes[0].reason == f"GPU enumeration failed: {gpus[1].fault}"
    finally:
        monitor.stop()
        nvml.shutdown()


def test_plugin_serves_every_gpu_and_the_lost_one_unhealthy(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    nvml = open_sim(str(node_file(tmp_path)))
    nvml.init()
    uuids = [g.uuid for g in nvml.gpus()]
    nvml.shutdown()
    plugin = start_plugin(sock_dir, f"sim:{node_file(tmp_path)}")  # fail-on-init-error: true (default)
    processes.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    devices = kubelet.wait_for_devices(
        GPU, lambda d: len(d) == 4 and d[uuids[1]].health == "Unhealthy", timeout=10
    )
    assert {i for i, s in devices.items() if s.health == "Healthy"} == {uuids[0], uuids[2], uuids[3]}
    wait_until(lambda: "GPU enumeration failed" in plugin.log(), timeout=5, what="enumeration line")
    line = next(li for li in plugin.log().splitlines() if "GPU enumeration failed" in li)
    assert f"gpu={uuids[1]} index=1 error=" in line and "NVML_ERROR_GPU_IS_LOST" in line
    assert plugin.alive()


def test_topology_scores_a_gpu_whose_links_fail_by_numa_only(tmp_path: Path) -> None:
    from nvdp.node.nvml.types import PcieLevel
    from nvdp.plugins.deviceplugin.allocation import Topology

    nvml = open_sim(str(node_file(tmp_path)))
    nvml.init()
    try:
        gpus = nvml.gpus()
        topology = Topology.from_nvml(nvml, gpus)  # GPU 1's link queries fail with GPU_IS_LOST
    finally:
        nvml.shutdown()
    assert (gpus[0].uuid, gpus[1].uuid) not in topology.links
    assert topology.link(gpus[0].uuid, gpus[1].uuid).pcie == PcieLevel.SYSTEM  # no NUMA node known
    assert (gpus[0].uuid, gpus[2].uuid) in topology.links or (gpus[2].uuid, gpus[0].uuid) in topology.links
