"""The DRA driver's devices and slices (pure): golden ResourceSlices for the simulated nodes with
NVIDIA's attribute and capacity names, Unhealthy devices tainted or withdrawn, big pools split, and
the value formats the API validates (semver versions, canonical quantities).

Regenerate the golden files after an intended change: `NVDP_UPDATE_GOLDEN=1 pytest tests/test_dra_slices.py`.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from nvdp.node.nvml.types import MigDeviceInfo, MigPlacement
from nvdp.plugins.dra.devices import (
    DriverFacts,
    architecture,
    brand,
    device_misfits,
    node_devices,
    pcie_bus_id,
    quantity,
    semver,
)
from nvdp.plugins.dra.names import claim_spec_file, mig_device_name
from nvdp.plugins.dra.slices import MAX_DEVICES_PER_SLICE, Taint, pool_slices, same_content
from tests.builders import full_gpu, mig_enabled_gpu, sim_gpus

GOLDEN = Path(__file__).parent / "data" / "dra"
UPDATE = os.environ.get("NVDP_UPDATE_GOLDEN") == "1"
FACTS = DriverFacts("550.54.15", "12.4")
# NVIDIA's current driver (k8s-dra-driver-gpu HEAD, cmd/gpu-kubelet-plugin deviceinfo.go / mig.go)
NVIDIA_GPU_ATTRIBUTES = {
    "type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion",
    "cudaDriverVersion", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot",
}  # fmt: skip
NVIDIA_MIG_ATTRIBUTES = {
    "type", "uuid", "parentUUID", "profile", "productName", "brand", "architecture",
    "cudaComputeCapability", "driverVersion", "cudaDriverVersion", "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
}  # fmt: skip
# kept from NVIDIA's earlier releases: index, minor, parentIndex (v25.3), pcieBusID (v25.3, v25.8)
FORMER_GPU_ATTRIBUTES = {"index": "int", "minor": "int", "pcieBusID": "string"}
FORMER_MIG_ATTRIBUTES = {"index": "int", "parentIndex": "int", "pcieBusID": "string"}
NVIDIA_MIG_CAPACITIES = {
    "memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines",
}  # fmt: skip


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-a100-mig", "pcie-4"])
def test_golden_slices(profile: str) -> None:
    devices = node_devices(sim_gpus(profile), FACTS)
    slices = pool_slices("node-a", 1, devices, {}, taints=True)
    golden = GOLDEN / f"slices-{profile}.json"
    if UPDATE:
        golden.write_text(json.dumps(slices, indent=2) + "\n")
    assert slices == json.loads(golden.read_text())


def test_names_attributes_and_capacities_are_nvidias() -> None:
    devices = node_devices(sim_gpus("dgx-a100-mig"), FACTS)
    by_type: dict[str, list[dict[str, object]]] = {}
    for device in devices:
        by_type.setdefault(device.type, []).append(device.slice_entry())
    # MIG-enabled GPUs 0-3 offer their MIG devices, GPUs 4-7 themselves
    assert [d["name"] for d in by_type["gpu"]] == [f"gpu-{n}" for n in range(4, 8)]
    assert [d["name"] for d in by_type["mig"]][:2] == ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1"]
    assert [d["name"] for d in by_type["mig"]][-4:] == [
        "gpu-2-mig-3g20gb-9-0",
        "gpu-2-mig-2g10gb-14-4",
        "gpu-2-mig-1g5gb-19-6",
        "gpu-3-mig-7g40gb-0-0",
    ]
    for entry in by_type["gpu"]:
        assert set(entry["attributes"]) == NVIDIA_GPU_ATTRIBUTES | set(FORMER_GPU_ATTRIBUTES)  # type: ignore[arg-type]
        assert set(entry["capacity"]) == {"memory"}  # type: ignore[arg-type]
    whole = by_type["mig"][-1]
    assert set(whole["attributes"]) == NVIDIA_MIG_ATTRIBUTES | set(FORMER_MIG_ATTRIBUTES)  # type: ignore[arg-type]
    assert set(whole["capacity"]) == NVIDIA_MIG_CAPACITIES | {f"memorySlice{n}" for n in range(8)}  # type: ignore[arg-type]
    assert whole["attributes"]["profile"] == {"string": "7g.40gb"}  # type: ignore[index]
    assert whole["capacity"]["multiprocessors"] == {"value": "98"}  # type: ignore[index]


def test_attribute_kinds_and_values() -> None:
    gpu, mig = (
        next(d for d in node_devices(sim_gpus("dgx-a100-mig"), FACTS) if d.type == t) for t in ("gpu", "mig")
    )
    kinds = {name: next(iter(value)) for name, value in gpu.attributes.items()}
    assert kinds == {
        "type": "string", "uuid": "string", "productName": "string", "brand": "string",
        "architecture": "string", "cudaComputeCapability": "version", "driverVersion": "version",
        "cudaDriverVersion": "version", "resource.kubernetes.io/pciBusID": "string",
        "resource.kubernetes.io/pcieRoot": "string", **FORMER_GPU_ATTRIBUTES,
    }  # fmt: skip
    assert {
        n: next(iter(v)) for n, v in mig.attributes.items() if n in FORMER_MIG_ATTRIBUTES
    } == FORMER_MIG_ATTRIBUTES
    assert gpu.attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:87:00.0"}  # GPU 4
    assert gpu.attributes["pcieBusID"] == gpu.attributes["resource.kubernetes.io/pciBusID"]
    assert gpu.attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:86"}  # shared with GPU 5
    assert mig.attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:06"}  # its GPU's
    assert mig.attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}


def test_a_gpu_without_a_known_pcie_root_has_no_pcie_root_attribute() -> None:
    (device,) = node_devices([full_gpu(0)], FACTS)
    assert "resource.kubernetes.io/pcieRoot" not in device.attributes
    assert device.attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}


@pytest.mark.parametrize(
    ("profile", "placement", "name"),
    [
        ("1g.5gb", MigPlacement(19, 4, 1), "gpu-3-mig-1g5gb-19-4"),
        ("7g.80gb", MigPlacement(0, 0, 8), "gpu-3-mig-7g80gb-0-0"),
        ("1g.10gb+me", MigPlacement(20, 2, 1), "gpu-3-mig-1g10gb-me-20-2"),
        ("1g.12gb+me.all", MigPlacement(21, 0, 1), "gpu-3-mig-1g12gb-meall-21-0"),
        ("1g.24gb-me", MigPlacement(47, 6, 1), "gpu-3-mig-1g24gb-me-47-6"),
        ("2g.24gb+gfx", MigPlacement(32, 0, 2), "gpu-3-mig-2g24gb-gfx-32-0"),
        ("1c.2g.10gb", MigPlacement(14, 2, 2), "gpu-3-mig-1c2g10gb-ci1-14-2"),
        ("2g.10gb", None, "gpu-3-mig-2g10gb-gi5-ci1"),
    ],
    ids=["1g", "7g", "plus-me", "me-all", "minus-me", "gfx", "compute-instance", "no-placement"],
)
def test_mig_device_names_are_nvidias_canonical_form(
    profile: str, placement: MigPlacement | None, name: str
) -> None:
    gpu = replace(full_gpu(1), minor=3)  # the minor, not the index, names the GPU
    mig = MigDeviceInfo("MIG-a", 0, 5, 1, profile, 9984 << 20, gpu.uuid, 1, placement)
    assert mig_device_name(gpu, mig) == name


def test_compute_instances_of_one_gpu_instance_get_names_of_their_own() -> None:
    gpu = full_gpu(0)
    one = MigDeviceInfo("MIG-a", 0, 1, 0, "1c.2g.10gb", 9984 << 20, gpu.uuid, 0, MigPlacement(14, 0, 2))
    two = replace(one, uuid="MIG-b", index=1, ci_id=1)
    assert [mig_device_name(gpu, m) for m in (one, two)] == [
        "gpu-0-mig-1c2g10gb-ci0-14-0",
        "gpu-0-mig-1c2g10gb-ci1-14-0",
    ]


@pytest.mark.parametrize(
    ("profile", "ci_id", "placement", "former"),
    [
        ("1g.5gb", 0, MigPlacement(19, 4, 1), "gpu-0-mig-19-4-1"),
        ("1c.2g.10gb", 1, MigPlacement(14, 0, 2), "gpu-0-mig-14-0-2-ci1"),
        ("2g.10gb", 0, None, "gpu-0-mig-gi1-ci0"),
    ],
    ids=["mig", "compute-instance", "no-placement"],
)
def test_mig_devices_keep_their_former_name(
    profile: str, ci_id: int, placement: MigPlacement | None, former: str
) -> None:
    gpu = mig_enabled_gpu(0, MigDeviceInfo("MIG-a", 0, 1, ci_id, profile, 9984 << 20, "GPU-0", 0, placement))
    (device,) = node_devices([gpu], FACTS)
    assert device.former_name == former
    assert device.name != former


def test_misfits_name_the_mig_gpus_without_mig_devices_and_the_gpus_without_a_pcie_root() -> None:
    rooted = [
        replace(g, pcie_root="pci0000:00") for g in (full_gpu(0), mig_enabled_gpu(1), mig_enabled_gpu(2))
    ]
    assert [(m.reason, m.subject) for m in device_misfits(rooted)] == [("MigWithoutDevices", "GPUs 1,2")]
    (empty,) = device_misfits(rooted)
    assert empty.message == (
        "GPUs 1,2 (GPU-1, GPU-2) have MIG enabled but no MIG devices; they offer no DRA device until MIG "
        "devices are created"
    )
    (rootless,) = device_misfits([full_gpu(3)])
    assert rootless.message == (
        "GPU 3: no PCIe root in sysfs (/sys/bus/pci/devices/0000:0a:00.0); their devices are published "
        "without resource.kubernetes.io/pcieRoot"
    )
    assert device_misfits([replace(full_gpu(0), pcie_root="pci0000:00", fault="lost")]) == ()
    assert device_misfits(sim_gpus("dgx-a100-mig")) == ()


def test_unhealthy_devices_are_tainted_or_withdrawn() -> None:
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    taint = Taint.of("XID 79: GPU has fallen off the bus", 79, "2026-01-02T03:04:05Z")
    tainted = pool_slices("node-a", 3, devices, {"gpu-1": taint}, taints=True)[0]["spec"]["devices"]
    assert [d.get("taints") for d in tainted] == [
        None,
        [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule",
          "timeAdded": "2026-01-02T03:04:05Z"}],
        None,
        None,
    ]  # fmt: skip
    withdrawn = pool_slices("node-a", 3, devices, {"gpu-1": taint}, taints=False)[0]["spec"]["devices"]
    assert [d["name"] for d in withdrawn] == ["gpu-0", "gpu-2", "gpu-3"]
    assert Taint.of("double-bit ECC error (memory is corrupt)", None, "t").value == (
        "double-bit-ECC-error-memory-is-corrupt"
    )


def test_a_big_pool_is_split_into_slices_of_one_generation() -> None:
    gpus = [full_gpu(n) for n in range(MAX_DEVICES_PER_SLICE + 3)]
    slices = pool_slices("node-a", 7, node_devices(gpus, FACTS), {}, taints=True)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, 3]
    assert [s["metadata"]["name"] for s in slices] == ["node-a-gpu.nvidia.com-0", "node-a-gpu.nvidia.com-1"]
    assert {json.dumps(s["spec"]["pool"]) for s in slices} == {
        json.dumps({"name": "node-a", "generation": 7, "resourceSliceCount": 2})
    }


def test_a_pool_without_devices_is_one_slice_without_devices() -> None:
    (empty,) = pool_slices("node-a", 7, [], {}, taints=True)
    assert empty["metadata"]["name"] == "node-a-gpu.nvidia.com-0"
    assert empty["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 1}
    assert empty["spec"]["devices"] == []
    devices = node_devices([full_gpu(0)], FACTS)
    (withdrawn,) = pool_slices("node-a", 7, devices, {"gpu-0": Taint("xid-79", "t")}, taints=False)
    assert withdrawn["spec"]["devices"] == []


def test_same_content_ignores_the_generation_and_what_the_server_adds() -> None:
    (wanted,) = pool_slices("node-a", 2, node_devices(sim_gpus("pcie-4"), FACTS), {}, taints=True)
    published = json.loads(json.dumps(wanted))
    published["spec"]["pool"]["generation"] = 9
    published["metadata"].update(resourceVersion="17", uid="u")
    assert same_content(published, wanted)
    published["spec"]["devices"].pop()
    assert not same_content(published, wanted)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("8.0", "8.0.0"),
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),
        ("12", "12.0.0"),
        ("x", "0.0.0"),
    ],
)
def test_versions_are_semver(text: str, version: str) -> None:
    assert semver(text) == version


def test_value_formats() -> None:
    assert quantity(40960 << 20) == {"value": "40Gi"}
    assert quantity(4864 << 20) == {"value": "4864Mi"}
    assert quantity(14) == {"value": "14"} and quantity(0) == {"value": "0"}
    assert pcie_bus_id("00000000:07:00.0") == "0000:07:00.0"
    assert pcie_bus_id("0000:8A:00.0") == "0000:8a:00.0"
    assert [
        brand(n) for n in ("NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA RTX A6000", "Quadro RTX 8000")
    ] == [
        "Nvidia",
        "Tesla",
        "NvidiaRTX",
        "QuadroRTX",
    ]
    assert [architecture(*cc) for cc in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))] == [
        "Volta",
        "Turing",
        "Ampere",
        "Ada Lovelace",
        "Hopper",
        "Blackwell",
    ]
    assert claim_spec_file("3f2c") == "k8s.gpu.nvidia.com-claim_3f2c.json"


@pytest.mark.parametrize(
    ("profile", "roots"),
    [
        ("pcie-4", ["pci0000:16", "pci0000:16", "pci0000:97", "pci0000:97"]),  # two host bridges
        ("dgx-a100", ["pci0000:06"] * 2 + ["pci0000:46"] * 2 + ["pci0000:86"] * 2 + ["pci0000:b6"] * 2),
        ("gb200-nvl", ["pci0008:00", "pci0009:00", "pci0018:00", "pci0019:00"]),  # a domain each
        (
            "dgx-h100",
            ["pci0000:17", "pci0000:29", "pci0000:39", "pci0000:5c"]
            + ["pci0000:99", "pci0000:aa", "pci0000:b9", "pci0000:da"],
        ),
    ],
    ids=["pcie-4", "dgx-a100", "gb200-nvl", "dgx-h100"],
)
def test_simulated_pcie_roots_follow_the_bus_ids_and_host_bridges(profile: str, roots: list[str]) -> None:
    devices = node_devices(sim_gpus(profile), FACTS)
    assert [d.attributes["resource.kubernetes.io/pcieRoot"]["string"] for d in devices] == roots
