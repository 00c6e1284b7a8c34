"""The DRA driver's slice publisher with the real `kubernetes` client against the API stand-in:
published within a second, health shown as taints or by withdrawal (whichever the server keeps,
found by a dry run and said in one line), re-published when someone deletes or edits a slice, nothing
written when a restart finds its slices right, failures retried."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.base.backoff import Backoff
from nvdp.kube import new_api_client
from nvdp.kube.reflector import WatchTimers
from nvdp.plugins.dra.cluster import KubeResourceApi
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.plugins.dra.slices import Taint
from testkit import wait_until
from tests.builders import sim_gpus
from tests.dra_support import stop_publisher
from tests.kube_api_standin import KubeApiStandin
from tests.readings import log_lines
from tests.test_dra_slices import FACTS
from tests.test_kube_dra import GROUP, discovery

GOLDEN = Path(__file__).parent / "data" / "dra"
SLICES = f"{GROUP}/v1/resourceslices"
NAME = "node-a-gpu.nvidia.com-0"
XID = {"gpu-1": Taint.of("XID 79", 79, "2026-01-02T03:04:05Z")}


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        standin.put(GROUP, discovery("v1", "v1beta1"))
        yield standin


def publisher(api: KubeApiStandin, **kwargs: object) -> SlicePublisher:
    resources = KubeResourceApi(new_api_client(host=api.url, retries=0))
    timers = WatchTimers(timeout_s=5, silence_s=10)
    return SlicePublisher(resources, "node-a", watch_timers=timers, backoff=Backoff(0.05, 0.2), **kwargs)  # type: ignore[arg-type]


def stored(api: KubeApiStandin, version: str = "v1") -> dict[str, object]:
    return api.objects[f"{GROUP}/{version}/resourceslices/{NAME}"]


def devices_of(api: KubeApiStandin) -> list[dict[str, object]]:
    return stored(api)["spec"]["devices"]  # type: ignore[index,no-any-return]


def test_publishes_the_golden_slice_and_shows_health_as_taints(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pub = publisher(api)
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    pub.update(devices, {})
    pub.start()
    try:
        assert pub.published.wait(1.0)
        golden = json.loads((GOLDEN / "slices-pcie-4.json").read_text())
        assert stored(api)["spec"] == golden[0]["spec"]
        assert api.objects.keys() == {GROUP, f"{SLICES}/{NAME}"}  # the probe was a dry run
        pub.update(devices, XID)
        wait_until(lambda: "taints" in devices_of(api)[1], 2, "gpu-1 tainted")
        assert stored(api)["spec"]["pool"]["generation"] == 2  # type: ignore[index]
        assert devices_of(api)[1]["taints"] == [XID["gpu-1"].entry()]
        assert [d.get("taints") for d in devices_of(api)[::2]] == [None, None]
    finally:
        stop_publisher(pub, api)
    assert sum("Unhealthy devices" in line for line in log_lines(caplog)) == 1
    assert "Unhealthy devices shown as device taints in the ResourceSlice" in "\n".join(log_lines(caplog))


def test_a_server_without_device_taints_gets_unhealthy_devices_withdrawn(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api.drop_device_taints = True
    pub = publisher(api)
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    pub.update(devices, XID)
    pub.start()
    try:
        assert pub.published.wait(2.0)
        assert [d["name"] for d in devices_of(api)] == ["gpu-0", "gpu-2", "gpu-3"]
        pub.update(devices, {})  # recovered
        wait_until(lambda: len(devices_of(api)) == 4, 2, "gpu-1 back")
    finally:
        stop_publisher(pub, api)
    assert pub.taints is False
    assert (
        "Unhealthy devices withdrawn from the ResourceSlice why="
        '"the API server drops device taints (no DRADeviceTaints)"' in log_lines(caplog)
    )


def test_a_deleted_or_edited_slice_is_published_again(api: KubeApiStandin) -> None:
    pub = publisher(api)
    pub.update(node_devices(sim_gpus("pcie-4"), FACTS), {})
    pub.start()
    try:
        assert pub.published.wait(2.0)
        path = f"{SLICES}/{NAME}"
        api.delete(path)  # the kubelet wipes its node's slices when it starts
        wait_until(lambda: path in api.objects, 2, "the slice re-created")
        edited = json.loads(json.dumps(api.objects[path]))
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]
        api.put(path, edited)
        wait_until(lambda: pub.writes == 3 and len(devices_of(api)) == 4, 2, "the slice repaired")
        api.put(path, json.loads(json.dumps(api.objects[path])))  # touched, not changed
        api.put(
            f"{SLICES}/node-b-gpu.nvidia.com-0", {"spec": {"nodeName": "node-b", "driver": "gpu.nvidia.com"}}
        )
        api.delete(path)  # seen after the two above: they were judged first
        wait_until(lambda: path in api.objects and pub.writes >= 4, 2, "the slice re-created")
    finally:
        stop_publisher(pub, api)
    assert pub.writes == 4  # the touch and another node's slice wrote nothing


def test_a_restart_that_finds_its_slices_right_writes_nothing(api: KubeApiStandin) -> None:
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    first = publisher(api)
    first.update(devices, {})
    first.start()
    assert first.published.wait(2.0)
    stop_publisher(first, api)
    again = publisher(api)
    again.update(devices, {})
    again.start()
    try:
        assert again.published.wait(2.0)
        assert (again.writes, again.generation) == (0, 1)
        again.update(devices, XID)
        wait_until(lambda: stored(api)["spec"]["pool"]["generation"] == 2, 2, "generation 2")  # type: ignore[index]
    finally:
        stop_publisher(again, api)


def test_failures_are_retried_and_v1beta1_is_spoken_where_served(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    api.put(GROUP, discovery("v1beta1"))
    api.fail(500, 2, method="POST")
    pub = publisher(api)
    pub.update(node_devices(sim_gpus("dgx-a100"), FACTS), {})
    pub.start()
    try:
        assert pub.published.wait(3.0)
    finally:
        stop_publisher(pub, api)
    device = stored(api, "v1beta1")["spec"]["devices"][0]  # type: ignore[index]
    assert set(device) == {"name", "basic"}
    assert any(line.startswith("cannot publish ResourceSlices; will retry") for line in log_lines(caplog))


def test_a_cluster_without_dra_is_said_and_retried(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    api.delete(GROUP)
    pub = publisher(api)
    pub.update(node_devices(sim_gpus("pcie-4"), FACTS), {})
    pub.start()
    try:
        wait_until(lambda: api.count("GET", GROUP) >= 2, 3, "discovery retried")
        assert not pub.published.is_set()
        api.put(GROUP, discovery("v1"))
        assert pub.published.wait(3.0)
    finally:
        stop_publisher(pub, api)
    assert any("is DRA enabled in this cluster?" in line for line in log_lines(caplog))


def test_slices_are_owned_by_their_node_once_it_can_be_read(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail(403, 1, method="GET", path_prefix="/api/v1/nodes/")
    api.put("/api/v1/nodes/node-a", {"metadata": {"name": "node-a", "uid": "node-uid"}})
    pub = publisher(api)
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    pub.update(devices, {})
    pub.start()
    try:
        assert pub.published.wait(2.0)
        assert "ownerReferences" not in stored(api)["metadata"]
        pub.update(devices, XID)  # the next write reads the Node again
        owner = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid", "controller": True}
        wait_until(lambda: stored(api)["metadata"].get("ownerReferences") == [owner], 2, "the owner")
    finally:
        stop_publisher(pub, api)
    (line,) = [x for x in log_lines(caplog) if "without their Node as owner" in x]
    assert "HTTP 403" in line


def test_an_update_that_wants_what_is_wanted_already_asks_the_api_nothing(api: KubeApiStandin) -> None:
    pub = publisher(api)
    devices = node_devices(sim_gpus("pcie-4"), FACTS)
    assert pub.update([], {})  # an empty pool is published too
    pub.start()
    try:
        assert pub.published.wait(2.0)
        assert pub.update(devices, {})
        wait_until(lambda: f"{SLICES}/{NAME}" in api.objects and len(devices_of(api)) == 4, 2, "the devices")
        # a claim prepared, a record changed: the same devices wanted again, nothing to sync
        assert [pub.update(list(devices), {}) for _ in range(3)] == [False] * 3
        assert pub.update(devices, XID)  # a real change is published
        wait_until(lambda: "taints" in devices_of(api)[1], 2, "gpu-1 tainted")
    finally:
        stop_publisher(pub, api)
