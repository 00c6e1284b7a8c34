"""A GPU shared by consumable capacity (pure parts): the golden slices of dgx-a100 with every GPU
shared, quantities, the stand-in scheduler's accounting (defaults, rounding to the step, ranges,
shares that never exceed a capacity), what a claim's share makes of its CDI edits, and the one-line
errors of bad shares.

Regenerate the golden file after an intended change: `NVDP_UPDATE_GOLDEN=1 pytest tests/test_dra_capacity.py`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdp.config.load import parse_text
from nvdp.kube.resourceslices import from_served, to_served
from nvdp.node.mps.layout import MpsRoot
from nvdp.node.nvml.types import ComputeMode
from nvdp.plugins.dra.capacity import (
    Share,
    capacity_misfits,
    kept_shared,
    one_gpu,
    share_of,
    shared_by_capacity,
)
from nvdp.plugins.dra.capacity_mps import CapacityDaemons
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef, allocated_devices
from nvdp.plugins.dra.devices import DriverFacts, node_devices
from nvdp.plugins.dra.mps import DraMps
from nvdp.plugins.dra.slices import pool_slices
from nvdp.sim.dra.scheduler import AllocationError, allocate, consumed_capacity, nvidia_device_classes
from tests.builders import sim_gpus
from tests.kube_api_standin import KubeApiStandin
from tests.readings import log_lines
from tests.test_dra_publisher import devices_of, publisher
from tests.test_dra_slices import UPDATE
from tests.test_kube_dra import GROUP, discovery

GOLDEN = Path(__file__).parent / "data" / "dra" / "slices-dgx-a100-capacity.json"
FACTS = DriverFacts("550.54.15", "12.4")
GPUS = sim_gpus("dgx-a100")
CLASSES = nvidia_device_classes()
INDEX_0 = "device.attributes['gpu.nvidia.com'].index == 0"


def shared_slices(shared: set[str] | None = None) -> list[dict[str, Any]]:
    devices = shared_by_capacity(
        node_devices(GPUS, FACTS), {g.uuid for g in GPUS} if shared is None else shared
    )
    return pool_slices("node-a", 1, devices, {}, taints=True)


def capacity_claim(
    name: str, capacity: dict[str, str] | None = None, selector: str = INDEX_0
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def schedule_all(claims: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocate each claim in turn against the ones before it; each one's results."""
    done: list[dict[str, Any]] = []
    for c in claims:
        allocation = allocate(c, CLASSES, slices, set(), "node-a", consumed_capacity(done))
        done.append({**c, "status": {"allocation": allocation}})
    return [d["status"]["allocation"]["devices"]["results"][0] for d in done]


def test_golden_slices_of_a_node_shared_by_capacity() -> None:
    slices = shared_slices()
    if UPDATE:
        GOLDEN.write_text(json.dumps(slices, indent=2) + "\n")
    assert slices == json.loads(GOLDEN.read_text())
    device = slices[0]["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "40Gi",
            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        },
        "compute": {
            "value": "100",
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
        },
    }
    # v1beta1 (a 1.32 server) keeps the field under `basic`, and reads back the same
    old = to_served(slices[0], "v1beta1")["spec"]["devices"][0]
    assert old["basic"]["allowMultipleAllocations"] is True and "allowMultipleAllocations" not in old
    assert from_served(to_served(slices[0], "v1beta1"))["spec"] == slices[0]["spec"]


def test_only_the_named_whole_gpus_are_shared() -> None:
    devices = shared_slices({GPUS[0].uuid})[0]["spec"]["devices"]
    assert [d["name"] for d in devices if d.get("allowMultipleAllocations")] == ["gpu-0"]
    assert devices[1]["capacity"] == {"memory": {"value": "40Gi"}}
    mig = sim_gpus("dgx-a100-mig")
    shared = shared_by_capacity(node_devices(mig, FACTS), {mig[0].uuid})
    assert not any(d.allow_multiple_allocations for d in shared)  # GPU 0 has MIG on: its MIG devices stay
    (misfit,) = capacity_misfits(mig, {mig[0].uuid})
    assert (
        misfit.message
        == "dra.consumableCapacity: GPU 0 left out: MIG mode is on (its MIG devices are published)"
    )


def test_three_claims_share_a_gpu_as_the_scheduler_accounts_them() -> None:
    slices = shared_slices()
    asked = [
        capacity_claim("a", {"memory": "10Gi", "compute": "50"}),
        capacity_claim("b", {"memory": "1500Mi"}),
        capacity_claim("c"),
    ]
    results = schedule_all(asked, slices)
    assert [r["device"] for r in results] == ["gpu-0"] * 3
    assert [r["consumedCapacity"] for r in results] == [
        {"compute": "50", "memory": "10Gi"},
        {"compute": "0", "memory": "2Gi"},  # rounded up to the step
        {"compute": "0", "memory": "1Gi"},  # the defaults
    ]
    assert len({r["shareID"] for r in results}) == 3
    # 13Gi of 40Gi and 50 of 100 taken: 27Gi and 50 left on gpu-0
    assert (
        schedule_all([*asked, capacity_claim("d", {"memory": "27Gi", "compute": "50"})], slices)[-1]["device"]
        == "gpu-0"
    )
    for too_much in ({"memory": "28Gi"}, {"compute": "51"}):
        with pytest.raises(AllocationError) as error:
            schedule_all([*asked, capacity_claim("e", too_much)], slices)
        (what,) = [f"{k} {v}" for k, v in too_much.items()]
        assert str(error.value) == (
            "request gpu: 1 device(s) of class gpu.nvidia.com wanted, 0 free on node node-a match "
            f"with {what} to spare"
        )


def test_a_request_outside_the_policy_or_naming_no_capacity_of_the_device_gets_nothing() -> None:
    slices = shared_slices()
    device = slices[0]["spec"]["devices"][0]
    device["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] = "8Gi"
    assert (
        schedule_all([capacity_claim("fits", {"memory": "7.5Gi"})], slices)[0]["consumedCapacity"]["memory"]
        == "8Gi"
    )
    for asked in ({"memory": "9Gi"}, {"encoders": "1"}):
        with pytest.raises(AllocationError, match="0 free on node node-a match with"):
            schedule_all([capacity_claim("no", asked)], slices)
    device["capacity"]["memory"]["requestPolicy"] = {"default": "4Gi", "validValues": ["4Gi", "20Gi"]}
    assert (
        schedule_all([capacity_claim("v", {"memory": "5Gi"})], slices)[0]["consumedCapacity"]["memory"]
        == "20Gi"
    )
    with pytest.raises(AllocationError):
        schedule_all([capacity_claim("v", {"memory": "21Gi"})], slices)


def test_a_gpu_not_shared_is_taken_whole_and_a_capacity_request_bounds_it() -> None:
    slices = shared_slices({GPUS[0].uuid})
    one = "device.attributes['gpu.nvidia.com'].index == 1"
    (whole,) = schedule_all([capacity_claim("w", {"memory": "40Gi"}, one)], slices)
    assert whole == {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}
    with pytest.raises(AllocationError):
        schedule_all([capacity_claim("big", {"memory": "41Gi"}, one)], slices)


def shared_device() -> Any:
    return shared_by_capacity(node_devices(GPUS, FACTS), {GPUS[0].uuid})[0]


def test_a_share_makes_an_mps_client_limited_to_it(tmp_path: Path) -> None:
    device = shared_device()
    share = share_of(device, {"memory": "10Gi", "compute": "50"}, "ns/a")
    assert share == Share("gpu-0", GPUS[0].uuid, 10 << 30, 50)
    shares = simulated_shares(tmp_path)
    result = Allocated("gpu", device.name, {"memory": "10Gi", "compute": "50"}, "share-a")
    edits = shares.edits(ClaimRef("ns", "a", "a"), [result], {device.name: device})[0][device.name]
    pipe = f"{tmp_path}/gpu.nvidia.com/{GPUS[0].uuid}/pipe"
    assert edits["env"] == [
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPUS[0].uuid}=10240M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
    ]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (pipe, pipe),
        (f"{tmp_path}/shm", "/dev/shm"),
    ]
    result = Allocated("gpu", device.name, {"memory": "1Gi", "compute": "0"}, "share-b")
    no_cap = shares.edits(ClaimRef("ns", "b", "b"), [result], {device.name: device})[0][device.name]["env"]
    assert [e.split("=")[0] for e in no_cap] == [
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ]
    # a server that dropped consumedCapacity allocated the device whole: the whole GPU it is
    assert share_of(device, None, "ns/c") == Share("gpu-0", GPUS[0].uuid, 40 << 30, 100)


@pytest.mark.parametrize(
    ("consumed", "error"),
    [
        ({"memory": "lots"}, "ResourceClaim ns/a: consumedCapacity memory 'lots' of gpu-0 is no quantity"),
        ({"memory": "41Gi"}, "ResourceClaim ns/a: consumedCapacity memory 41Gi of gpu-0 is outside 0..40Gi"),
        (
            {"memory": "1Gi", "compute": "101"},
            "ResourceClaim ns/a: consumedCapacity compute 101 of gpu-0 is outside 0..100",
        ),
        ({"memory": "1Ki"}, "ResourceClaim ns/a: consumedCapacity memory of gpu-0 is under 1Mi"),
    ],
    ids=["no quantity", "over the memory", "over the compute", "under a MiB"],
)  # fmt: skip
def test_a_bad_share_is_the_claims_one_line_error(consumed: dict[str, str], error: str) -> None:
    with pytest.raises(ClaimError) as raised:
        share_of(shared_device(), consumed, "ns/a")
    assert str(raised.value) == error


def test_one_claims_shares_must_be_of_one_gpu() -> None:
    shares = [Share("gpu-0", "GPU-a", 1 << 30, 0), Share("gpu-1", "GPU-b", 1 << 30, 0)]
    assert one_gpu(shares[:1], "ns/a") == "GPU-a" and one_gpu([], "ns/a") is None
    with pytest.raises(ClaimError) as raised:
        one_gpu(shares, "ns/a")
    assert str(raised.value) == (
        "ResourceClaim ns/a: shares of 2 GPUs (gpu-0, gpu-1); a claim's shares must be of one GPU "
        "(its containers are clients of one MPS control daemon)"
    )


def test_a_gpu_with_shares_stays_shared_and_one_held_whole_waits_until_unprepared() -> None:
    assert kept_shared({"A"}, {"A", "B", "C"}, {"B"}) == {"A", "B"}  # B: its shares are prepared still
    assert kept_shared(set(), {"B"}, set()) == set()
    assert kept_shared({"A", "D"}, set(), {"D"}) == {"A"}  # D: a claim holds it whole
    assert kept_shared({"A", "D"}, set(), set()) == {"A", "D"}


def test_an_allocation_result_carries_its_share() -> None:
    ref = ClaimRef("ns", "a", "uid-a")
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
    shared = {**result, "shareID": "s-1", "consumedCapacity": {"memory": "2Gi"}}
    obj: dict[str, Any] = {
        "metadata": {"uid": "uid-a"},
        "status": {"allocation": {"devices": {"results": [shared]}}},
    }
    (found,) = allocated_devices(obj, ref, "node-a")
    assert (found.consumed_capacity, found.share_id) == ({"memory": "2Gi"}, "s-1")
    obj["status"]["allocation"]["devices"]["results"] = [replace_key(shared, "consumedCapacity", ["2Gi"])]
    with pytest.raises(
        ClaimError, match=r"^ResourceClaim ns/a: an allocation result's consumedCapacity is not a map$"
    ):
        allocated_devices(obj, ref, "node-a")
    obj["status"]["allocation"]["devices"]["results"] = [result]
    assert allocated_devices(obj, ref, "node-a")[0].consumed_capacity is None


def replace_key(obj: dict[str, Any], key: str, value: object) -> dict[str, Any]:
    return {**obj, key: value}


def test_a_device_record_says_it_allows_multiple_allocations() -> None:
    device = shared_device()
    assert device.slice_entry()["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in replace(device, allow_multiple_allocations=False).slice_entry()


@pytest.mark.parametrize("dropped", [False, True], ids=["kept", "dropped by the server"])
def test_a_server_without_consumable_capacity_gets_the_gpus_whole(
    caplog: pytest.LogCaptureFixture, dropped: bool
) -> None:
    caplog.set_level(logging.INFO)
    with KubeApiStandin() as api:
        api.put(GROUP, discovery("v1", "v1beta1"))
        api.drop_consumable_capacity = dropped
        pub = publisher(api)
        pub.update(shared_by_capacity(node_devices(GPUS, FACTS), {GPUS[0].uuid}), {})
        pub.start()
        try:
            assert pub.published.wait(2.0)
            gpu0 = devices_of(api)[0]
            assert ("allowMultipleAllocations" in gpu0) is not dropped
            assert (gpu0["capacity"] == {"memory": {"value": "40Gi"}}) is dropped  # type: ignore[index]
            assert pub.writes == 1  # the slice says what the server keeps: not written again
        finally:
            pub.stop()
    assert pub.sharing is not dropped
    line = 'GPUs shared by capacity published whole why="the API server drops allowMultipleAllocations'
    assert (line in "\n".join(log_lines(caplog))) is dropped


def doc_blocks() -> list[str]:
    """The code blocks of docs/dra.md's section on sharing by capacity."""
    text = (Path(__file__).parent.parent / "docs" / "dra.md").read_text()
    section = text.split("## A GPU shared by capacity\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(?:yaml)?\n(.*?)```", section, re.S)


def test_the_documented_config_and_claims_do_as_the_docs_say() -> None:
    config, published, claims, _ = doc_blocks()
    assert parse_text(config).dra.consumable_capacity == ("0", "1")
    device = shared_slices({GPUS[0].uuid})[0]["spec"]["devices"][0]
    said = yaml.safe_load(published)
    assert said == {k: device[k] for k in ("allowMultipleAllocations", "capacity")}
    slices = shared_slices({GPUS[0].uuid})
    documented = [
        {**c, "metadata": {**c["metadata"], "uid": c["metadata"]["name"]}} for c in yaml.safe_load_all(claims)
    ]
    results = schedule_all(documented, slices)
    assert [(r["device"], r["consumedCapacity"]) for r in results] == [
        ("gpu-0", {"memory": "10Gi", "compute": "50"}),
        ("gpu-0", {"memory": "2Gi", "compute": "0"}),
        ("gpu-0", {"memory": "1Gi", "compute": "0"}),
    ]
    fourth = capacity_claim("d", {"memory": "30Gi"}, selector="device.allowMultipleAllocations == true")
    with pytest.raises(AllocationError, match="with memory 30Gi to spare$"):
        schedule_all([*documented, fourth], slices)
    whole = capacity_claim("w", {"memory": "40Gi"}, selector="device.allowMultipleAllocations == false")
    assert schedule_all([*documented, whole], slices)[-1] == {
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"
    }  # fmt: skip


class NoComputeModes:
    """A simulated node's daemons never change a compute mode."""

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        raise AssertionError(gpu_uuid)

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        raise AssertionError(gpu_uuid)


def simulated_shares(root: Path) -> CapacityDaemons:
    return CapacityDaemons(DraMps(MpsRoot(root), NoComputeModes(), {}, simulated=True))


def test_prepared_shares_never_exceed_the_gpu(tmp_path: Path) -> None:
    daemons = simulated_shares(tmp_path)
    device = shared_device()
    devices = {device.name: device}

    def prepare(uid: str, consumed: dict[str, str] | None) -> tuple[Share, ...]:
        result = Allocated("gpu", device.name, consumed, f"share-{uid}")
        return daemons.edits(ClaimRef("ns", uid, uid), [result], devices)[1]

    assert prepare("a", {"memory": "30Gi", "compute": "60"})[0].memory_bytes == 30 << 30
    assert (tmp_path / "gpu.nvidia.com" / GPUS[0].uuid / ".started").exists()  # simulated: the marker
    for uid, consumed, error in (
        ("b", {"memory": "11Gi"}, "memory 10Gi left by the claims prepared on it, not the 11Gi"),
        ("c", {"memory": "1Gi", "compute": "41"}, "compute 40 left by the claims prepared on it, not the 41"),
        ("d", None, "memory 10Gi left by the claims prepared on it, not the 40Gi"),  # the whole GPU
    ):
        with pytest.raises(ClaimError) as raised:
            prepare(uid, consumed)
        assert str(raised.value) == f"ResourceClaim ns/{uid}: gpu-0 has {error} the claim consumes"
    assert prepare("b", {"memory": "10Gi", "compute": "40"})  # exactly what is left
    assert prepare("a", {"memory": "30Gi", "compute": "60"})  # prepared again: its own share is no other's
    daemons.release("a")
    assert prepare("d", {"memory": "30Gi"})
