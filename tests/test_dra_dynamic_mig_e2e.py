"""MIG made on demand (`dra.dynamicMig`): `nvdp dra-kubelet-plugin` as a process over real sockets and
files on a simulated node, with the kubelet stand-in, the API stand-in and the stand-in scheduler
packing placements by the published counters; a claim's placement made a MIG device at prepare and
destroyed at unprepare; NVML's refusal an error for that claim only; MIG devices no claim made left in
place. And a restart between prepare and unprepare (in process: the simulated NVML outlives it)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nvdp.config import RuntimeOptions
from nvdp.config.model import Config, Dra
from nvdp.node.nvml.sim import open_sim
from nvdp.plugins.dra.driver import DraDriver
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.options import DraSettings
from nvdp.sim.dra.api import MemoryResourceApi
from nvdp.sim.dra.scheduler import allocate, nvidia_device_classes, taken_devices
from nvdp.sim.kubelet.dra import Claim, DraManager
from nvdp.sim.kubelet.plugin_watcher import PluginWatcher
from testkit import wait_until
from testkit.dra import DYNAMIC_ALL, PROFILE
from testkit.driver_root import cap_files
from tests.builders import append_sim_event, sim_gpus
from tests.cdi_support import make_node
from tests.dra_support import claim_path, dra_cluster, make_claim, schedule, slices_of

GOLDEN = Path(__file__).parent / "data" / "dra"


def whole_pool(api: Any) -> bool:
    found = slices_of(api)
    return bool(found) and len(found) == found[0]["spec"]["pool"]["resourceSliceCount"]


def spec_nodes(cluster: Any, uid: str) -> set[str]:
    spec = json.loads((cluster.node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    return {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes") or []}


@pytest.mark.parametrize("profile", ["dgx-a100-mig-empty", "dgx-a100-mig"])
def test_golden_slices(tmp_path: Path, profile: str) -> None:
    with dra_cluster(tmp_path, f"sim:{profile}", config=DYNAMIC_ALL) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: whole_pool(cluster.api), 10, "the slices")
        golden = json.loads((GOLDEN / f"slices-{profile}-dynamic.json").read_text())
        assert [s["spec"] for s in slices_of(cluster.api)] == [g["spec"] for g in golden]
        if profile == "dgx-a100-mig":  # GPUs 0-3 hold MIG devices no claim made; 4-7 have MIG off
            wait_until(lambda: "reason=MigDevicesNotClaimed" in cluster.log(), 5, "the WARNING")
            (line,) = [x for x in cluster.log().splitlines() if "reason=MigDevicesNotClaimed" in x]
            assert " WARNING " in line and "GPU 0: MIG-" in line and "GPU 3: MIG-" in line
            assert "(7g.40gb)" in line and "GPU 4" not in line


def test_placements_made_packed_refused_and_destroyed(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    gpus = sim_gpus("dgx-a100-mig-empty")
    with dra_cluster(
        tmp_path, "sim:dgx-a100-mig-empty", config=DYNAMIC_ALL, env={"NVDP_SIM_EVENTS": str(events)}
    ) as cluster:
        cap_files(cluster.node.driver_root, gpus)
        cluster.start()
        cluster.registered()
        wait_until(lambda: whole_pool(cluster.api), 10, "the slices")
        api, kubelet = cluster.api, cluster.kubelet
        claims = {
            name: make_claim(api, name, "mig.nvidia.com", PROFILE.format(profile))
            for name, profile in (("a", "3g.20gb"), ("b", "3g.20gb"), ("c", "1g.5gb"), ("d", "1g.5gb"))
        }
        # the counters pack them: two 3g.20gb fill GPU 0's memory slices, the 1g.5gb go to GPU 1
        got = {name: schedule(api, claim) for name, claim in claims.items()}
        assert got == {
            "a": ["gpu-0-mig-3g20gb-9-0"],
            "b": ["gpu-0-mig-3g20gb-9-4"],
            "c": ["gpu-1-mig-1g5gb-19-0"],
            "d": ["gpu-1-mig-1g5gb-19-1"],
        }
        kubelet.start_pod("pod-a", DRIVER_NAME, [claims["a"]])
        kubelet.start_pod("pod-b", DRIVER_NAME, [claims["b"]])
        assert "/dev/nvidia-caps/nvidia-cap12" in spec_nodes(cluster, "uid-a")  # GPU 0, GPU instance 1
        assert "/dev/nvidia-caps/nvidia-cap21" in spec_nodes(cluster, "uid-b")  # GPU 0, GPU instance 2
        made = [x for x in cluster.log().splitlines() if "MIG device made" in x]
        assert len(made) == 2 and "gi=1" in made[0] and "gi=2" in made[1]

        # someone makes a 2g.10gb on GPU 1 (memory slices 0-1): left in place, taken out of the counters
        append_sim_event(events, uuid=gpus[1].uuid, mig=["2g.10gb"])
        wait_until(lambda: "reason=MigDevicesNotClaimed" in cluster.log(), 5, "the WARNING")
        counters = {
            c["name"]: c["counters"] for s in slices_of(api) for c in s["spec"].get("sharedCounters") or []
        }
        wait_until(lambda: _counter(api, "gpu-1-counter-set", "memory-slice-1") == "0", 5, "slices out")
        assert counters["gpu-0-counter-set"]["memory-slice-0"] == {"value": "1"}
        e = make_claim(api, "e", "mig.nvidia.com", PROFILE.format("7g.40gb"))
        assert schedule(api, e) == ["gpu-2-mig-7g40gb-0-0"]
        # d's placement (slice 1) is taken now: NVML refuses it, an error for that claim only
        answer = kubelet.node_prepare(DRIVER_NAME, [claims["d"], e]).claims
        assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in answer["uid-d"].error
        assert answer["uid-d"].error.startswith("device gpu-1-mig-1g5gb-19-1: NVML refused a 1g.5gb GPU")
        assert not answer["uid-e"].error

        # unprepare destroys a's MIG device: the same placement is made again, a new MIG device
        kubelet.end_pod("pod-a", DRIVER_NAME, [claims["a"]])
        assert not (cluster.node.cdi / "k8s.gpu.nvidia.com-claim_uid-a.json").exists()
        wait_until(lambda: "MIG device destroyed" in cluster.log(), 5, "destroyed")
        api.delete(claim_path("ns", "a"))
        f = make_claim(api, "f", "mig.nvidia.com", PROFILE.format("3g.20gb"))
        assert schedule(api, f) == ["gpu-0-mig-3g20gb-9-0"]
        kubelet.start_pod("pod-f", DRIVER_NAME, [f])
        uuids = [x.split("uuid=")[1].split()[0] for x in cluster.log().splitlines() if "MIG device made" in x]
        assert len(uuids) == 4 and len(set(uuids)) == 4  # a, b, e, f


def test_an_xid_on_a_gpu_taints_its_placements(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    gpu = sim_gpus("dgx-a100-mig-empty")[3]
    with dra_cluster(
        tmp_path, "sim:dgx-a100-mig-empty", config=DYNAMIC_ALL, env={"NVDP_SIM_EVENTS": str(events)}
    ) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: whole_pool(cluster.api), 10, "the slices")
        append_sim_event(events, uuid=gpu.uuid, xid=79)

        def tainted() -> set[str]:
            devices = [d for s in slices_of(cluster.api) for d in s["spec"].get("devices") or []]
            return {d["name"] for d in devices if d.get("taints")}

        wait_until(lambda: len(tainted()) == 25, 10, "GPU 3's placements tainted")
        assert {name.split("-mig-")[0] for name in tainted()} == {"gpu-3"}


def _counter(api: Any, counter_set: str, name: str) -> str | None:
    for s in slices_of(api):
        for c in s["spec"].get("sharedCounters") or []:
            if c["name"] == counter_set:
                return str(c["counters"][name]["value"])
    return None


@contextmanager
def _plugin(tmp_path: Path, nvml: Any, api: MemoryResourceApi) -> Iterator[DraManager]:
    """The DRA plugin in process on `nvml` (which outlives it, as the GPUs outlive a plugin restart)."""
    config = replace(Config(), dra=Dra("all", dynamic_mig="all"))
    config = replace(config, flags=replace(config.flags, nvidia_driver_root=str(tmp_path / "driver")))
    settings = DraSettings(
        config=config,
        runtime=RuntimeOptions(nvml="sim:dgx-a100-mig-empty", device_rescan_interval=0.05),
        node_name="node-a",
        cdi_root=str(tmp_path / "cdi"),
        kubelet_registrar_directory_path=str(tmp_path / "registry"),
        kubelet_plugins_directory_path=str(tmp_path / "plugins"),
    )
    driver = DraDriver(settings, {}, nvml=nvml, api=api)
    watcher = PluginWatcher(tmp_path / "registry")
    watcher.start()
    kubelet = DraManager(watcher)
    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()
    try:
        watcher.wait_for_registration(DRIVER_NAME, 20)
        assert driver.publisher.published.wait(20)
        yield kubelet
    finally:
        driver.request_stop()
        thread.join(10)
        kubelet.close()
        watcher.stop()


def test_a_restart_between_prepare_and_unprepare_finds_the_mig_device(tmp_path: Path) -> None:
    nvml = open_sim("dgx-a100-mig-empty")
    (tmp_path / "registry").mkdir()
    make_node(tmp_path / "driver", sim_gpus("dgx-a100-mig-empty"))
    cap_files(tmp_path / "driver", sim_gpus("dgx-a100-mig-empty"))
    api = MemoryResourceApi()
    for device_class in nvidia_device_classes().values():
        api.put("DeviceClass", device_class)
    api.put("Node", {"metadata": {"name": "node-a", "uid": "node-a-uid"}})
    exactly = {
        "deviceClassName": "mig.nvidia.com",
        "count": 1,
        "selectors": [{"cel": {"expression": PROFILE.format("2g.10gb")}}],
    }
    claim: dict[str, Any] = {
        "metadata": {"name": "r", "namespace": "ns", "uid": "uid-r"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    ref = Claim("ns", "r", "uid-r")
    with _plugin(tmp_path, nvml, api) as kubelet:
        classes = {c["metadata"]["name"]: c for c in api.objects("DeviceClass")}
        allocation = allocate(claim, classes, api.objects("ResourceSlice"), taken_devices([]), "node-a")
        api.put("ResourceClaim", {**claim, "status": {"allocation": allocation}})
        assert not kubelet.node_prepare(DRIVER_NAME, [ref]).claims["uid-r"].error
    nvml.init()  # the plugin shut its NVML down
    (made,) = [m for g in nvml.gpus() for m in g.mig_devices]  # the plugin stopped; the MIG device stays
    saved = json.loads((tmp_path / "plugins" / DRIVER_NAME / "checkpoint.json").read_text())
    assert saved["claims"]["uid-r"]["made"] == [
        {"device": "gpu-0-mig-2g10gb-14-0", "gi_id": 3, "gpu_uuid": made.parent_uuid, "uuid": made.uuid}
    ]
    with _plugin(tmp_path, nvml, api) as kubelet:
        devices = {d["name"] for s in api.objects("ResourceSlice") for d in s["spec"].get("devices") or []}
        assert "gpu-0-mig-2g10gb-14-0" in devices  # the claim's placement: not a foreign MIG device
        assert not kubelet.node_unprepare(DRIVER_NAME, [ref]).claims["uid-r"].error
        assert [m for g in nvml.gpus() for m in g.mig_devices] == []
