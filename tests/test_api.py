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


# ---- the DRA plugin, resource health and plugin registration APIs (nvdp.api.dra) ------------------

DRA_MESSAGES = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}


@pytest.mark.parametrize(
    ("service", "package"),
    [
        ("v1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1"),
        ("v1beta1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ],
)
def test_dra_plugin_wire(service: str, package: str) -> None:
    from nvdp.api.dra import DRA_PLUGIN

    pb_module = DRA_PLUGIN[service].pb
    services = {
        s.full_name: [m.name for m in s.methods] for s in pb_module.DESCRIPTOR.services_by_name.values()
    }
    assert services == {f"{package}.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"]}
    for message, fields in DRA_MESSAGES.items():
        descriptor = pb_module.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == fields, message
        assert descriptor.full_name == f"{package}.{message}"
    claims = pb_module.DESCRIPTOR.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name[
        "claims"
    ]
    assert claims.message_type.GetOptions().map_entry


@pytest.mark.parametrize(
    ("service", "device_health"),
    [
        (
            "v1.DRAResourceHealth",
            {
                "device": 1,
                "health": 2,
                "last_updated_time": 3,
                "health_check_timeout_seconds": 4,
                "message": 5,
            },
        ),
        ("v1alpha1.DRAResourceHealth", {"device": 1, "health": 2, "last_updated_time": 3}),
    ],
)
def test_resource_health_wire(service: str, device_health: dict[str, int]) -> None:
    from nvdp.api.dra import RESOURCE_HEALTH

    pb_module = RESOURCE_HEALTH[service].pb
    package = service.split(".")[0]
    (found,) = pb_module.DESCRIPTOR.services_by_name.values()
    assert found.full_name == service  # the name the kubelet matches in the supported versions
    assert [m.name for m in found.methods] == ["NodeWatchResources"]
    assert found.methods_by_name["NodeWatchResources"].server_streaming
    messages = pb_module.DESCRIPTOR.message_types_by_name
    assert {f.name: f.number for f in messages["DeviceHealth"].fields} == device_health
    assert {f.name: f.number for f in messages["DeviceIdentifier"].fields} == {
        "pool_name": 1,
        "device_name": 2,
    }
    assert {f.name: f.number for f in messages["NodeWatchResourcesResponse"].fields} == {"devices": 1}
    values = pb_module.DESCRIPTOR.enum_types_by_name["HealthStatus"].values_by_name
    assert {name: v.number for name, v in values.items()} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert messages["DeviceHealth"].full_name == f"{package}.DeviceHealth"


def test_plugin_registration_wire() -> None:
    from nvdp.api.dra import registration

    (found,) = registration.pb.DESCRIPTOR.services_by_name.values()
    assert found.full_name == "pluginregistration.Registration"
    assert [m.name for m in found.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    messages = registration.pb.DESCRIPTOR.message_types_by_name
    assert {f.name: f.number for f in messages["PluginInfo"].fields} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert {f.name: f.number for f in messages["RegistrationStatus"].fields} == {
        "plugin_registered": 1,
        "error": 2,
    }
    assert len(messages["InfoRequest"].fields) == len(messages["RegistrationStatusResponse"].fields) == 0
