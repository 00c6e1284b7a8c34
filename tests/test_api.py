"""The committed protobuf code is current, and the wire contract matches the kubelet's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nvdp.api import pb

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
