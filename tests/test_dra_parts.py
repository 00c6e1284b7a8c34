"""The DRA driver's parts on their own: the stand-in scheduler's selector forms and allocation, what of
a claim is this driver's, the checkpoint (and one it cannot read), a claim's CDI spec (and a device
whose nodes are missing)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from nvdp.node.cdi.names import CdiSettings
from nvdp.node.cdi.node_files import DriverFiles
from nvdp.plugins.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from nvdp.plugins.dra.claim_specs import ClaimSpecs
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef, allocated_devices
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.slices import Taint, pool_slices
from nvdp.sim.dra.scheduler import AllocationError, allocate, selector_matches, taken_devices
from tests.builders import sim_gpus
from tests.dra_support import DEVICE_CLASSES
from tests.readings import log_lines
from tests.test_dra_slices import FACTS

DEVICE = {
    "name": "gpu-0",
    "attributes": {"type": {"string": "gpu"}, "index": {"int": 0}, "x.io/ok": {"bool": True}},
}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ("device.driver == 'gpu.nvidia.com'", True),
        ("device.driver != 'gpu.nvidia.com'", False),
        ("device.attributes['gpu.nvidia.com'].type == 'gpu'", True),
        ("device.attributes['gpu.nvidia.com'].type == 'mig'", False),
        ("device.attributes['gpu.nvidia.com'].type != 'mig'", True),
        ("device.attributes['gpu.nvidia.com'].index == 0", True),
        ("device.attributes['gpu.nvidia.com'].index == '0'", False),
        ("device.attributes['x.io'].ok == true", True),
        ("device.attributes['gpu.nvidia.com'].profile == '1g.5gb'", False),  # no such attribute
        ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", True),
    ],
)
def test_selector_forms(expression: str, matches: bool) -> None:
    assert selector_matches(expression, "gpu.nvidia.com", DEVICE) is matches


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        (
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            "is a form the stand-in cannot evaluate",
        ),
        ("device.attributes['gpu.nvidia.com'].type == gpu", "is not a literal the stand-in scheduler reads"),
    ],
)
def test_other_selector_forms_are_refused_in_one_line(expression: str, problem: str) -> None:
    with pytest.raises(AllocationError, match=problem):
        selector_matches(expression, "gpu.nvidia.com", DEVICE)


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": "u"}, "spec": {"devices": {"requests": list(requests)}}}


def test_allocation_takes_free_untainted_matching_devices_in_slice_order() -> None:
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    taint = Taint.of("XID 79", 79, "t")
    slices = pool_slices("node-a", 1, devices, {"gpu-1": taint}, taints=True)
    two = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
    taken = {("gpu.nvidia.com", "node-a", "gpu-0")}
    allocation = allocate(claim(two), DEVICE_CLASSES, slices, taken, "node-a")
    assert [r["device"] for r in allocation["devices"]["results"]] == ["gpu-2", "gpu-3"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
    tolerant = {"name": "any", "exactly": {"deviceClassName": "gpu.nvidia.com", "tolerations": [
        {"key": "gpu.nvidia.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]}}  # fmt: skip
    assert (
        allocate(claim(tolerant), DEVICE_CLASSES, slices, taken, "node-a")["devices"]["results"][0]["device"]
        == "gpu-1"
    )
    flat = {"name": "old", "deviceClassName": "gpu.nvidia.com"}  # v1beta1's request
    assert (
        allocate(claim(flat), DEVICE_CLASSES, slices, set(), "node-a")["devices"]["results"][0]["device"]
        == "gpu-0"
    )
    with pytest.raises(
        AllocationError, match=r"^request gpus: 2 device\(s\) of class gpu.nvidia.com wanted, 1 free"
    ):
        allocate(
            claim(two), DEVICE_CLASSES, slices, taken | {("gpu.nvidia.com", "node-a", "gpu-2")}, "node-a"
        )
    with pytest.raises(AllocationError, match="no DeviceClass 'tpu'"):
        allocate(
            claim({"name": "t", "exactly": {"deviceClassName": "tpu"}}),
            DEVICE_CLASSES,
            slices,
            set(),
            "node-a",
        )
    with pytest.raises(AllocationError, match="0 free on node node-b match"):  # another node's devices: none
        allocate(claim(two), DEVICE_CLASSES, slices, set(), "node-b")


def test_taken_devices_are_every_allocated_result() -> None:
    allocated = {
        "status": {"allocation": {"devices": {"results": [{"driver": "d", "pool": "p", "device": "x"}]}}}
    }
    assert taken_devices([allocated, {"status": {}}]) == {("d", "p", "x")}


def test_what_of_a_claim_is_this_drivers_on_this_node() -> None:
    ref = ClaimRef("ns", "c", "u1")
    results = [
        {"request": "a", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
        {"request": "b", "driver": "gpu.nvidia.com", "pool": "node-b", "device": "gpu-0"},
        {"request": "c", "driver": "nic.example.com", "pool": "node-a", "device": "eth0"},
    ]
    obj = {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": results}}}}
    assert allocated_devices(obj, ref, "node-a") == [Allocated("a", "gpu-0")]
    with pytest.raises(ClaimError, match=r"^ResourceClaim ns/c is not allocated$"):
        allocated_devices({"metadata": {"uid": "u1"}}, ref, "node-a")
    other = {"opaque": {"driver": "nic.example.com", "parameters": {}}, "requests": ["c"]}
    obj["status"]["allocation"]["devices"]["config"] = [other]  # configs: nvdp.plugins.dra.sharing's
    assert allocated_devices(obj, ref, "node-a") == [Allocated("a", "gpu-0")]


def test_checkpoint_round_trip_and_a_file_not_ours(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    assert checkpoint.load() == {}
    claims = {"u": PreparedClaim("u", "ns", "c", (PreparedDevice(("gpu",), "node-a", "gpu-0", ("k=v",)),))}
    checkpoint.save(claims)
    assert checkpoint.load() == claims
    assert (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600
    nvidias = {"checksum": 1, "v2": {"preparedClaims": {}}}  # NVIDIA's driver's own format
    (tmp_path / "checkpoint.json").write_text(json.dumps(nvidias))
    caplog.set_level(logging.WARNING)
    assert checkpoint.load() is None  # unreadable: the preparer rebuilds the claims
    (aside,) = tmp_path.glob("checkpoint.json.bad-*")
    assert json.loads(aside.read_text()) == nvidias
    (line,) = log_lines(caplog)
    assert line.startswith("checkpoint unreadable; rebuilding the prepared claims from their CDI specs")


def test_a_claims_spec_and_a_device_without_its_nodes(tmp_path: Path) -> None:
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    settings = CdiSettings(spec_dir=str(tmp_path / "cdi"))
    specs = ClaimSpecs(settings, DriverFiles(), lambda: {"/dev/nvidia0": None, "/dev/nvidiactl": None})
    assert specs.write("u1", devices[:1]) == {"gpu-0": "k8s.gpu.nvidia.com/claim=u1-gpu-0"}
    spec = json.loads((tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_u1.json").read_text())
    assert [d["name"] for d in spec["devices"]] == ["u1-gpu-0"]  # no `all`: every claim would have one
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}]
    with pytest.raises(
        ClaimError, match=r"^no CDI spec for gpu-1: /dev/nvidia1 not found under the dev root$"
    ):
        specs.write("u2", devices[:2])
    assert specs.on_disk() == {"u1"}
    specs.remove("u1")
    specs.remove("u1")
    assert specs.on_disk() == set() and specs.write("u3", []) == {}


def test_node_state_finds_a_mig_device_by_its_former_name_too() -> None:
    state = NodeState(clock=lambda: 0.0)
    devices = node_devices(sim_gpus("dgx-a100-mig"), FACTS)
    state.set_devices(devices)
    mig = next(d for d in devices if d.name == "gpu-2-mig-1g5gb-19-6")
    state.set_health({mig.uuid}, {})
    assert state.device("gpu-2-mig-19-6-1") is state.device("gpu-2-mig-1g5gb-19-6") is mig
    assert state.unhealthy("gpu-2-mig-19-6-1") == state.unhealthy("gpu-2-mig-1g5gb-19-6") is not None
    assert state.device("gpu-2-mig-19-6-2") is None and state.unhealthy("gpu-4") is None
