"""Issue 9 hardening of what is advertised: replicas per device capped at config validation, a
resource whose ListAndWatch list would not fit the kubelet's message limit refused in one line, and
MIG profiles with attributes (`1g.5gb+me`) named as NVIDIA names them."""

from __future__ import annotations

from pathlib import Path

from nvdp.api import UNHEALTHY, pb
from nvdp.config import ReplicatedResource
from nvdp.config.model import resource_name
from nvdp.config.rules import MAX_REPLICAS_PER_DEVICE
from nvdp.node.gpus.list_size import MAX_LIST_AND_WATCH_BYTES, list_and_watch_bytes
from nvdp.node.gpus.resources import build_resources, default_mig_patterns
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin
from tests.builders import mig_enabled_gpu, sim_gpus, with_facts
from tests.test_config_options import WITH_FILE, errors


def test_replicas_over_the_cap_are_refused_in_one_line() -> None:
    file = "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 1000000000}]}}\n"
    assert errors([], WITH_FILE, file) == [
        "sharing.timeSlicing.resources[0].replicas: 1000000000 is over nvdp's limit of "
        f"{MAX_REPLICAS_PER_DEVICE} replicas per device (the kubelet could not receive the device list)"
    ]


def test_list_size_is_the_encoded_size() -> None:
    gpus = sim_gpus()
    (resource,) = build_resources(gpus, sharing=[ReplicatedResource("nvidia.com/gpu", 3)]).resources
    response = pb.ListAndWatchResponse()
    for device in resource.devices.values():
        item = response.devices.add(ID=device.id, health=UNHEALTHY)
        if device.numa_node is not None:
            item.topology.nodes.add(ID=device.numa_node)
    assert list_and_watch_bytes(list(resource.devices.values())) == response.ByteSize()


def test_a_resource_too_large_for_the_kubelet_is_withheld() -> None:
    base = sim_gpus()
    gpus = [
        with_facts(base[n % 8], uuid=f"GPU-{n:08d}-0000-0000-0000-000000000000", index=n) for n in range(64)
    ]
    built = build_resources(gpus, sharing=[ReplicatedResource("nvidia.com/gpu", MAX_REPLICAS_PER_DEVICE)])
    assert built.resources == []
    assert [(m.reason, m.message, m.withholds) for m in built.misfits] == [
        (
            "DeviceListTooLarge",
            "nvidia.com/gpu: 65536 devices make a 4254336-byte ListAndWatch list, over nvdp's limit of "
            f"{MAX_LIST_AND_WATCH_BYTES} bytes (half the kubelet's 4194304-byte gRPC message limit): lower "
            "the sharing replicas (at most 504 here); not advertised",
            ("nvidia.com/gpu",),
        )
    ]
    assert (
        len(build_resources(gpus, sharing=[ReplicatedResource("nvidia.com/gpu", 256)]).resources[0].devices)
        == 16384
    )


def test_mig_profile_with_attributes_gets_nvidias_resource_name() -> None:
    gpu = mig_enabled_gpu(0, "1g.5gb+me", *["1g.5gb"] * 6)
    names = [p.name for p in default_mig_patterns("mixed", [gpu])]
    assert names == ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-1g.5gb.me"]
    assert all(resource_name(name) == name for name in names)


def test_plugin_registers_a_media_extension_profile(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - {name: NVIDIA A100-SXM4-40GB, mig: [1g.5gb+me, 1g.5gb]}\n")
    processes.append(start_plugin(sock_dir, f"sim:{node}", extra=["--mig-strategy=mixed"]))
    kubelet.wait_for_registration("nvidia.com/mig-1g.5gb.me", timeout=20)
    kubelet.wait_for_devices("nvidia.com/mig-1g.5gb.me", lambda d: len(d) == 1, timeout=10)
    assert not kubelet.rejections
