"""The DRA requests of nvdp.kube (resourceslices, resourceclaims) with the real `kubernetes` client
against the API stand-in: the served version found, v1beta1's `basic` wrapping undone, conflicts kept
as statuses, dry runs stored nowhere, slices selected by node and driver."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube import new_api_client
from nvdp.kube.resourceclaims import KubeResourceClaims
from nvdp.kube.resourceslices import KubeResourceSlices, served_resource_version
from tests.kube_api_standin import KubeApiStandin

GROUP = "/apis/resource.k8s.io"


def discovery(*versions: str) -> dict[str, Any]:
    return {
        "kind": "APIGroup",
        "name": "resource.k8s.io",
        "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions],
    }


def a_slice(name: str = "node-a-gpu.nvidia.com-0", node: str = "node-a") -> dict[str, Any]:
    device = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "40Gi"}},
        "taints": [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        yield standin


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (("v1beta1", "v1beta2", "v1"), "v1"),
        (("v1beta1", "v1alpha3"), "v1beta1"),
        (("v1alpha3",), None),
        ((), None),
    ],
)
def test_the_newest_served_version_nvdp_speaks(
    api: KubeApiStandin, served: tuple[str, ...], expected: str | None
) -> None:
    if served:
        api.put(GROUP, discovery(*served))
    assert served_resource_version(new_api_client(host=api.url)) == expected


def test_an_unreachable_server_is_one_line() -> None:
    with pytest.raises(KubeError, match=r"^cannot read /apis/resource.k8s.io: "):
        served_resource_version(new_api_client(host="http://127.0.0.1:9", retries=0), timeout=2)


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_slices_round_trip_in_every_version(api: KubeApiStandin, version: str) -> None:
    slices = KubeResourceSlices(new_api_client(host=api.url), version)
    created = slices.create(a_slice())
    stored = api.objects[f"{GROUP}/{version}/resourceslices/node-a-gpu.nvidia.com-0"]
    assert stored["apiVersion"] == f"resource.k8s.io/{version}"
    device = stored["spec"]["devices"][0]
    if version == "v1beta1":
        assert set(device) == {"name", "basic"} and set(device["basic"]) == {
            "attributes",
            "capacity",
            "taints",
        }
    else:
        assert "basic" not in device
    assert created["spec"] == a_slice()["spec"] and created["apiVersion"] == "resource.k8s.io/v1"
    items, version_seen = slices.list("node-a", "gpu.nvidia.com")
    assert [i["spec"] for i in items] == [a_slice()["spec"]] and version_seen


def test_conflicts_keep_their_status_and_dry_runs_store_nothing(api: KubeApiStandin) -> None:
    slices = KubeResourceSlices(new_api_client(host=api.url), "v1")
    dry = slices.create(a_slice(), dry_run=True)
    assert dry["metadata"]["name"] == "node-a-gpu.nvidia.com-0" and api.objects == {}
    created = slices.create(a_slice())
    with pytest.raises(KubeStatusError) as exists:
        slices.create(a_slice())
    assert exists.value.status == 409
    stale = {**a_slice(), "metadata": {"name": "node-a-gpu.nvidia.com-0", "resourceVersion": "1"}}
    with pytest.raises(KubeStatusError) as changed:
        slices.replace(stale)
    assert changed.value.status == 409
    current = {**a_slice(), "metadata": created["metadata"]}
    assert slices.replace(current)["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    slices.delete("node-a-gpu.nvidia.com-0")
    slices.delete("node-a-gpu.nvidia.com-0")  # gone already: no error
    assert api.objects == {}


def test_a_server_without_device_taints_drops_them(api: KubeApiStandin) -> None:
    api.drop_device_taints = True
    slices = KubeResourceSlices(new_api_client(host=api.url), "v1")
    assert "taints" not in slices.create(a_slice(), dry_run=True)["spec"]["devices"][0]


def test_list_and_watch_select_by_node_and_driver(api: KubeApiStandin) -> None:
    slices = KubeResourceSlices(new_api_client(host=api.url), "v1")
    other = a_slice("node-b-gpu.nvidia.com-0", node="node-b")
    slices.create(other)
    items, since = slices.list("node-a", "gpu.nvidia.com")
    assert items == []
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        for event in slices.watch("node-a", "gpu.nvidia.com", since, timeout_seconds=2, silence=10):
            assert isinstance(event, dict)
            kind = event["type"]
            seen.append((kind, event["object"]["metadata"]["name"]))
            if kind == "DELETED":
                break
        done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    api.wait_for(lambda: api.count("GET", f"{GROUP}/v1/resourceslices", watch=True), 5, "the watch")
    slices.create(a_slice())
    slices.replace({**other, "metadata": {"name": "node-b-gpu.nvidia.com-0"}})
    slices.delete("node-a-gpu.nvidia.com-0")
    assert done.wait(5)
    assert seen == [("ADDED", "node-a-gpu.nvidia.com-0"), ("DELETED", "node-a-gpu.nvidia.com-0")]


def test_claims_are_read_by_namespace_and_name(api: KubeApiStandin) -> None:
    path = f"{GROUP}/v1beta2/namespaces/ns/resourceclaims/c"
    api.put(path, {"metadata": {"name": "c", "namespace": "ns", "uid": "u-1"}})
    claims = KubeResourceClaims(new_api_client(host=api.url), "v1beta2")
    claim = claims.get("ns", "c")
    assert claim is not None and claim["metadata"]["uid"] == "u-1"
    assert claims.get("ns", "missing") is None
    api.fail(500)
    with pytest.raises(KubeError, match=r"^cannot read ResourceClaim ns/c: HTTP 500 "):
        claims.get("ns", "c")
