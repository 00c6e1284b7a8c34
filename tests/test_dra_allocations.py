"""The DRA plugin's allocations entries (`nvdp.plugins.dra.allocations`, pure) and how the device plugin's
page and `nvdp status` show them: a MIG device's partition as its share, a held device the slices no
longer list, an Unhealthy one's reason, a claim whose pods are not read yet, pods withheld; the pods
a claim is reserved for."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdp.plugins.dra.allocations import dra_devices
from nvdp.plugins.dra.checkpoint import PreparedClaim, PreparedDevice
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.health import DeviceHealth
from nvdp.plugins.dra.holders import reserved_pods
from nvdp.plugins.ledger.dra_file import ALLOCATIONS_FILE, dra_resource, read_dra_allocations
from nvdp.plugins.ledger.report import describe_allocations
from tests.builders import sim_gpus
from tests.test_dra_slices import FACTS


def test_entries_of_mig_devices_held_gone_and_unhealthy() -> None:
    devices = node_devices(sim_gpus("dgx-a100-mig"), FACTS)
    mig = next(d for d in devices if d.type == "mig")
    claims = {
        "u1": PreparedClaim("u1", "ml", "train", (PreparedDevice(("gpu",), "node-a", mig.name, ()),)),
        "u2": PreparedClaim("u2", "ml", "old", (PreparedDevice(("gpu",), "node-a", "gpu-9", ()),)),
    }
    health = [DeviceHealth(mig.name, False, 0.0, "XID 79: GPU has fallen off the bus")]
    pods = {"u1": (("train-0", "p-uid"),)}
    entries = dra_devices(devices, health, claims, lambda uid: pods.get(uid, ()), {mig.name: "MPS"})
    by_name = {e["device"]: e for e in entries}
    held = by_name[mig.name]
    assert held["health"] == "Unhealthy" and held["reason"] == "XID 79: GPU has fallen off the bus"
    assert held["share"].startswith(f"MIG {mig.attributes['profile']['string']}, memory slices ")
    assert held["share"].endswith("; MPS")
    assert held["pods"] == [
        {"namespace": "ml", "name": "train-0", "uid": "p-uid", "container": "", "claim": "ml/train"}
    ]
    gone = by_name["gpu-9"]
    assert (gone["advertised"], gone["gpu"], gone["health"]) == (False, None, "Unknown")
    assert gone["claims"] == [{"namespace": "ml", "name": "old", "uid": "u2"}] and gone["pods"] == []

    withheld = {e["device"]: e for e in dra_resource(entries, pods=False)}
    assert withheld[mig.name]["holders"] == 1 and "pods" not in withheld[mig.name]
    assert "claims" not in withheld["gpu-9"]
    text = describe_allocations({"readAt": None, "resources": {"gpu.nvidia.com": entries}})
    (row,) = [line for line in text.splitlines() if line.startswith("  gpu-9 ")]
    assert row.split() == ["gpu-9", "?", "Unknown", "claim", "ml/old"]


def test_the_pods_a_claim_is_reserved_for() -> None:
    reserved = [
        {"resource": "pods", "name": "a", "uid": "ua"},
        {"resource": "pods", "name": "a", "uid": "ua"},  # twice: once
        {"resource": "pods", "name": "b"},  # no UID: None
        {"resource": "jobs", "apiGroup": "batch", "name": "j"},  # not a pod
        {"resource": "pods", "name": ""},
        "pods/c",
    ]
    assert reserved_pods({"status": {"reservedFor": reserved}}) == (("a", "ua"), ("b", None))
    assert reserved_pods({"status": {"reservedFor": "x"}}) == () == reserved_pods(None)


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"driver": ' + "[" * 5000 + "]" * 5000 + "}"],
    ids=["not-json", "not-an-object", "nested"],
)
def test_an_unreadable_allocations_file_is_none(tmp_path: Path, text: str) -> None:
    """The device plugin reads the DRA plugin's file: one it cannot read (JSON nested deeper than
    Python's recursion limit included) is no DRA allocations, never an exception."""
    path = tmp_path / ALLOCATIONS_FILE
    path.write_text(text)
    assert read_dra_allocations(path) is None
