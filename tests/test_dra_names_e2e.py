"""What a node moving from NVIDIA's DRA driver, or from an earlier nvdp, finds: NVIDIA's current MIG
device names and standard PCI attributes in the slice (claims select on them through the stand-in
scheduler), claims prepared under the former MIG names unprepared after an upgrade and still held in
the hand-over, and an empty pool published (with one WARNING naming the MIG-enabled GPUs without
MIG devices) where DRA has no device to offer. The plugin process against the API and kubelet
stand-ins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvdp.plugins.dra.names import claim_spec_file
from nvdp.sim.kubelet.dra import Claim
from testkit import wait_until
from tests.builders import sim_gpus
from tests.dra_support import DRIVER, claim_path, dra_cluster, make_claim, published, schedule, slices_of

# Two MIG-enabled A100s without a MIG device yet (mig-manager between layouts).
MIG_WITHOUT_DEVICES = "gpus:\n  - {name: NVIDIA A100-SXM4-40GB, count: 2, mig: []}\n"


@pytest.mark.parametrize(
    ("selector", "device"),
    [
        ("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:97'", "gpu-2"),
        ("device.attributes['resource.kubernetes.io'].pciBusID == '0000:b1:00.0'", "gpu-3"),
        ("device.attributes['gpu.nvidia.com'].index == 1", "gpu-1"),  # a claim written for v25.3
        ("device.attributes['gpu.nvidia.com'].pcieBusID == '0000:98:00.0'", "gpu-2"),  # for v25.8
    ],
    ids=["pcie-root", "pci-bus-id", "v25.3-index", "v25.8-pcie-bus-id"],
)
def test_claims_select_on_nvidias_attributes_current_and_former(
    tmp_path: Path, selector: str, device: str
) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        claim = make_claim(cluster.api, "c1", selector=selector)
        assert schedule(cluster.api, claim) == [device]
        answer = cluster.kubelet.node_prepare(DRIVER, [claim]).claims[claim.uid]
        assert not answer.error and [d.device_name for d in answer.devices] == [device]


def test_mig_devices_are_published_under_nvidias_names(tmp_path: Path) -> None:
    with dra_cluster(tmp_path, "sim:dgx-a100-mig") as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        names = [n for n in published(cluster.api) if n.startswith("gpu-2-")]
        assert names == ["gpu-2-mig-3g20gb-9-0", "gpu-2-mig-2g10gb-14-4", "gpu-2-mig-1g5gb-19-6"]
        mig = published(cluster.api)["gpu-2-mig-1g5gb-19-6"]["attributes"]
        assert mig["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:46"}  # its GPU's
        assert mig["resource.kubernetes.io/pciBusID"] == {"string": "0000:47:00.0"}


def test_a_claim_prepared_under_a_former_mig_name_is_unprepared_after_an_upgrade(tmp_path: Path) -> None:
    """The previous nvdp named GPU 0's first 1g.5gb `gpu-0-mig-19-0-1`; its claim is checkpointed so."""
    gpu0 = sim_gpus("dgx-a100-mig")[0].uuid
    uid, former = "uid-before-upgrade", "gpu-0-mig-19-0-1"
    with dra_cluster(tmp_path, "sim:dgx-a100-mig") as cluster:
        checkpoint = cluster.node.checkpoint
        checkpoint.parent.mkdir(parents=True)
        device = {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": former,
            "cdi_device_ids": [f"k8s.gpu.nvidia.com/claim={uid}-{former}"],
        }
        entry = {"namespace": "ns", "name": "old", "devices": [device]}
        checkpoint.write_text(json.dumps({"version": "nvdp/v1", "claims": {uid: entry}}))
        cluster.node.cdi.mkdir(parents=True, exist_ok=True)
        spec = cluster.node.cdi / claim_spec_file(uid)
        spec.write_text(
            json.dumps(
                {
                    "cdiVersion": "0.5.0",
                    "kind": "k8s.gpu.nvidia.com/claim",
                    "devices": [{"name": f"{uid}-{former}", "containerEdits": {}}],
                }
            )
        )
        cluster.start()
        cluster.registered()
        wait_until(lambda: "gpu-0-mig-1g5gb-19-0" in published(cluster.api), 10, "the new names")
        record = cluster.node.plugins / DRIVER / "served-by-dra.json"
        wait_until(lambda: record.exists() and json.loads(record.read_text())["holds"], 10, "the hold")
        assert json.loads(record.read_text())["holds"] == {gpu0: "claim ns/old"}  # GPU 0 stays held
        claim = Claim("ns", "old", uid)
        again = cluster.kubelet.node_prepare(DRIVER, [claim]).claims[uid]
        assert not again.error and [d.device_name for d in again.devices] == [former]  # from the checkpoint
        assert spec.exists()
        assert cluster.kubelet.node_unprepare(DRIVER, [claim]).claims[uid].error == ""
        assert not spec.exists()
        assert json.loads(checkpoint.read_text())["claims"] == {}


def test_a_claim_allocated_under_a_former_mig_name_is_prepared_after_an_upgrade(tmp_path: Path) -> None:
    """Scheduled from the previous nvdp's slice, prepared by this one: the same MIG device."""
    with dra_cluster(tmp_path, "sim:dgx-a100-mig") as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        claim = make_claim(cluster.api, "allocated-before", "mig.nvidia.com")
        result = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-2-mig-19-6-1"}
        allocation = {"devices": {"results": [result]}}
        cluster.api.merge_patch(claim_path("ns", "allocated-before"), {"status": {"allocation": allocation}})
        answer = cluster.kubelet.node_prepare(DRIVER, [claim]).claims[claim.uid]
        assert not answer.error
        (device,) = answer.devices
        assert device.device_name == "gpu-2-mig-19-6-1"  # as the allocation names it
        assert list(device.cdi_device_ids) == [f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-2-mig-1g5gb-19-6"]
        spec = cluster.specs()[claim_spec_file(claim.uid)]
        (edits,) = [
            d["containerEdits"] for d in spec["devices"] if d["name"] == f"{claim.uid}-gpu-2-mig-1g5gb-19-6"
        ]
        assert "/dev/nvidia2" in [n["path"] for n in edits["deviceNodes"]]  # GPU 2's


@pytest.mark.parametrize(
    ("config", "warned"),
    [
        ("version: v1\ndra:\n  devices: all\n", ["GPUs 0,1"]),
        ("version: v1\ndra:\n  devices: none\n", []),
    ],
    ids=["mig-without-devices", "dra-devices-none"],
)
def test_a_node_without_dra_devices_publishes_an_empty_pool(
    tmp_path: Path, config: str, warned: list[str]
) -> None:
    node_file = tmp_path / "mig-without-devices.yaml"
    node_file.write_text(MIG_WITHOUT_DEVICES)
    with dra_cluster(tmp_path, f"sim:{node_file}", config=config) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the empty pool")
        (empty,) = slices_of(cluster.api)
        assert empty["metadata"]["name"] == "node-a-gpu.nvidia.com-0"
        assert empty["spec"]["pool"]["resourceSliceCount"] == 1
        assert empty["spec"].get("devices", []) == []
        wait_until(lambda: "ResourceSlices published" in cluster.log(), 10, "published said")
        lines = [line for line in cluster.log().splitlines() if "MigWithoutDevices" in line]
        assert [w for w in warned if any(w in line for line in lines)] == warned
        assert len(lines) == len(warned)
        assert all("WARNING" in line for line in lines)
