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

from nvdp.dra.devices import DriverFacts, architecture, brand, node_devices, pcie_bus_id, quantity, semver
from nvdp.dra.names import claim_spec_file, mig_device_name
from nvdp.dra.slices import MAX_DEVICES_PER_SLICE, Taint, pool_slices, same_content
from nvdp.nvml.types import MigDeviceInfo, MigPlacement
from tests.builders import full_gpu, sim_gpus

GOLDEN = Path(__file__).parent / "data" / "dra"
UPDATE = os.environ.get("NVDP_UPDATE_GOLDEN") == "1"
FACTS = DriverFacts("550.54.15", "12.4")
NVIDIA_GPU_ATTRIBUTES = {
    "type", "uuid", "index", "minor", "productName", "brand", "architecture", "cudaComputeCapability",
    "driverVersion", "cudaDriverVersion", "pcieBusID",
}  # fmt: skip
NVIDIA_MIG_ATTRIBUTES = {
    "type", "uuid", "index", "parentUUID", "parentIndex", "parentMinor", "profile", "productName", "brand",
    "architecture", "cudaComputeCapability", "driverVersion", "cudaDriverVersion", "pcieBusID",
}  # fmt: skip
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
    assert [d["name"] for d in by_type["mig"]][:2] == ["gpu-0-mig-19-0-1", "gpu-0-mig-19-1-1"]
    assert [d["name"] for d in by_type["mig"]][-4:] == [
        "gpu-2-mig-9-0-4",
        "gpu-2-mig-14-4-2",
        "gpu-2-mig-19-6-1",
        "gpu-3-mig-0-0-8",
    ]
    for entry in by_type["gpu"]:
        assert set(entry["attributes"]) == NVIDIA_GPU_ATTRIBUTES  # type: ignore[arg-type]
        assert set(entry["capacity"]) == {"memory"}  # type: ignore[arg-type]
    whole = by_type["mig"][-1]
    assert set(whole["attributes"]) == NVIDIA_MIG_ATTRIBUTES  # type: ignore[arg-type]
    assert set(whole["capacity"]) == NVIDIA_MIG_CAPACITIES | {f"memorySlice{n}" for n in range(8)}  # type: ignore[arg-type]
    assert whole["attributes"]["profile"] == {"string": "7g.40gb"}  # type: ignore[index]
    assert whole["capacity"]["multiprocessors"] == {"value": "98"}  # type: ignore[index]


def test_compute_instances_of_one_gpu_instance_get_names_of_their_own() -> None:
    gpu = full_gpu(0)
    one = MigDeviceInfo("MIG-a", 0, 1, 0, "1c.2g.10gb", 9984 << 20, gpu.uuid, 0, MigPlacement(14, 0, 2))
    two = replace(one, uuid="MIG-b", index=1, ci_id=1)
    assert [mig_device_name(gpu, m) for m in (one, two)] == ["gpu-0-mig-14-0-2-ci0", "gpu-0-mig-14-0-2-ci1"]
    assert mig_device_name(gpu, replace(one, profile="2g.10gb", placement=None)) == "gpu-0-mig-gi1-ci0"


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
    assert pool_slices("node-a", 7, [], {}, taints=True) == []


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
