"""The committed protobuf code is current, and the wire contracts (the device-plugin API, the
PodResources API) match the kubelet's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from nvdp.api import pb
from nvdp.api.podresources import podresources_pb

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_not_stale() -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "api" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.main(["--check"]) == 0, "run `python api/generate.py` and commit the result"


def test_services_and_methods_have_the_kubelets_names() -> None:
    services = {s.full_name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    assert pb.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("DevicePluginOptions", {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
        ("RegisterRequest", {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        ("Device", {"ID": 1, "health": 2, "topology": 3}),
        ("TopologyInfo", {"nodes": 1}),
        ("NUMANode", {"ID": 1}),
        (
            "ContainerPreferredAllocationRequest",
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        (
            "ContainerAllocateResponse",
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        ("Mount", {"container_path": 1, "host_path": 2, "read_only": 3}),
        ("DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}),
        ("CDIDevice", {"name": 1}),
        ("PreStartContainerRequest", {"devices_ids": 1}),
        ("ContainerAllocateRequest", {"devices_ids": 1}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_field_numbers(message: str, fields: dict[str, int]) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields
    assert descriptor.full_name == f"v1beta1.{message}"


def test_pod_resources_service_has_the_kubelets_names() -> None:
    (service,) = podresources_pb.DESCRIPTOR.services_by_name.values()
    assert service.full_name == "v1.PodResourcesLister"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("AllocatableResourcesResponse", {"devices": (1, "M"), "cpu_ids": (2, "int64"), "memory": (3, "M")}),
        ("ListPodResourcesResponse", {"pod_resources": (1, "M")}),
        ("PodResources", {"name": (1, "string"), "namespace": (2, "string"), "containers": (3, "M")}),
        (
            "ContainerResources",
            {
                "name": (1, "string"),
                "devices": (2, "M"),
                "cpu_ids": (3, "int64"),
                "memory": (4, "M"),
                "dynamic_resources": (5, "M"),
            },
        ),
        ("ContainerMemory", {"memory_type": (1, "string"), "size": (2, "uint64"), "topology": (3, "M")}),
        (
            "ContainerDevices",
            {"resource_name": (1, "string"), "device_ids": (2, "string"), "topology": (3, "M")},
        ),
        ("TopologyInfo", {"nodes": (1, "M")}),
        ("NUMANode", {"ID": (1, "int64")}),
        (
            "DynamicResource",
            {"claim_name": (2, "string"), "claim_namespace": (3, "string"), "claim_resources": (4, "M")},
        ),
        (
            "ClaimResource",
            {
                "cdi_devices": (1, "M"),
                "driver_name": (2, "string"),
                "pool_name": (3, "string"),
                "device_name": (4, "string"),
            },
        ),
        ("CDIDevice", {"name": (1, "string")}),
        ("GetPodResourcesRequest", {"pod_name": (1, "string"), "pod_namespace": (2, "string")}),
        ("GetPodResourcesResponse", {"pod_resources": (1, "M")}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_pod_resources_field_numbers_and_types(message: str, fields: dict[str, tuple[int, str]]) -> None:
    """Numbers and wire types as the kubelet's api.proto has them ("M": a message)."""
    descriptor = podresources_pb.DESCRIPTOR.message_types_by_name[message]
    types = {
        FieldDescriptor.TYPE_STRING: "string",
        FieldDescriptor.TYPE_INT64: "int64",
        FieldDescriptor.TYPE_UINT64: "uint64",
        FieldDescriptor.TYPE_MESSAGE: "M",
    }
    assert {f.name: (f.number, types[f.type]) for f in descriptor.fields} == fields
    assert descriptor.full_name == f"v1.{message}"
    repeated = {f.name for f in descriptor.fields if f.is_repeated}
    singular = {"name", "namespace", "resource_name", "memory_type", "size", "topology", "ID"}
    singular |= {"claim_name", "claim_namespace", "driver_name", "pool_name", "device_name"}
    singular |= {"pod_name", "pod_namespace", "pod_resources"} if message.startswith("Get") else set()
    assert repeated == {f.name for f in descriptor.fields} - singular
