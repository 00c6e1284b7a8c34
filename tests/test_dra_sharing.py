"""NVIDIA's opaque device configs for gpu.nvidia.com read (`nvdp.plugins.dra.sharing`): the configs as
NVIDIA's strict decoder and validation take them (every bad one its exact line), NVIDIA's precedence (the
class's, then the claim's; a config naming the request over one naming none; of the device's kind),
the per-device memory keys; and the stand-in scheduler copying the configs as the real one does."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.units import parse_quantity
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.plugins.dra.sharing import (
    ConfigProblem,
    DeviceSharing,
    MpsSettings,
    OpaqueConfig,
    opaque_configs,
    parse,
    resolve,
)
from nvdp.plugins.dra.timeslice import NvidiaSmi, TimeSliceError
from nvdp.sim.dra.scheduler import allocation_config

REF = ClaimRef("ns", "c", "u1")
V = "resource.nvidia.com/v1beta1"


def gpu_config(sharing: Any = None, kind: str = "GpuConfig", **more: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": kind, **({} if sharing is None else {"sharing": sharing}), **more}


def opaque(parameters: Any, requests: list[str] | None = None, source: str = "FromClaim") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
    }
    return {**entry, "requests": requests} if requests is not None else entry


def claim_with(*config: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(config)}}}}


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        pytest.param(gpu_config(), DeviceSharing("GpuConfig"), id="no-sharing"),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing"}),
            DeviceSharing("GpuConfig", "TimeSlicing", "Default"),
            id="time-slicing-default-interval",
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            DeviceSharing("GpuConfig", "TimeSlicing", "Long"),
            id="time-slicing-long",
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig"),
            DeviceSharing("MigDeviceConfig", "TimeSlicing"),
            id="mig-time-slicing",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS"}),
            DeviceSharing("GpuConfig", "MPS", mps=MpsSettings()),
            id="mps-defaults",
        ),
        pytest.param(
            gpu_config(
                {
                    "strategy": "MPS",
                    "mpsConfig": {
                        "defaultActiveThreadPercentage": 25,
                        "defaultPinnedDeviceMemoryLimit": "10Gi",
                        "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi", "GPU-x": 2 << 30},
                    },
                },
                kind="MigDeviceConfig",
            ),
            DeviceSharing(
                "MigDeviceConfig", "MPS", mps=MpsSettings(25, 10 << 30, (("1", 4 << 30), ("GPU-x", 2 << 30)))
            ),
            id="mps-limits",
        ),
    ],
)
def test_configs_read(parameters: dict[str, Any], expected: DeviceSharing) -> None:
    assert parse(parameters, REF) == expected


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param([], "a gpu.nvidia.com config's parameters are not an object", id="not-an-object"),
        pytest.param(
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "a gpu.nvidia.com config's apiVersion 'resource.nvidia.com/v1' is not "
            "resource.nvidia.com/v1beta1",
            id="api-version",
        ),
        pytest.param(
            gpu_config(kind="TpuConfig"),
            "a gpu.nvidia.com config's kind 'TpuConfig' is not GpuConfig or MigDeviceConfig",
            id="unknown-kind",
        ),
        pytest.param(
            gpu_config(kind="VfioDeviceConfig"), "VfioDeviceConfig is not supported by nvdp", id="vfio"
        ),
        pytest.param(gpu_config(metadata={}), "GpuConfig: unknown field 'metadata'", id="unknown-top-field"),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercent": 5}}),
            "GpuConfig: unknown field 'sharing.mpsConfig.defaultActiveThreadPercent'",
            id="unknown-mps-field",
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {}}, kind="MigDeviceConfig"),
            "MigDeviceConfig: unknown field 'sharing.timeSlicingConfig'",
            id="mig-time-slicing-config",
        ),
        pytest.param(
            gpu_config({"strategy": "Exclusive"}),
            "GpuConfig: unknown sharing strategy 'Exclusive' (TimeSlicing or MPS)",
            id="strategy",
        ),
        pytest.param(
            gpu_config({}), "GpuConfig: unknown sharing strategy None (TimeSlicing or MPS)", id="none"
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}),
            "GpuConfig: unknown time-slice interval 'Fast' (Default, Short, Medium, Long)",
            id="interval",
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
            "GpuConfig: sharing.mpsConfig is set, but the strategy is TimeSlicing",
            id="time-slicing-with-mps-config",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}}),
            "GpuConfig: sharing.timeSlicingConfig is set, but the strategy is MPS",
            id="mps-with-time-slicing-config",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "GpuConfig: sharing.mpsConfig.defaultActiveThreadPercentage 101 is not within 0 to 100",
            id="percentage-range",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
            "GpuConfig: sharing.mpsConfig.defaultActiveThreadPercentage '50' is not an integer",
            id="percentage-type",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
            "GpuConfig: sharing.mpsConfig.defaultPinnedDeviceMemoryLimit '512Ki' is less than 1Mi",
            id="limit-too-low",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4GB"}}),
            "GpuConfig: sharing.mpsConfig.defaultPinnedDeviceMemoryLimit '4GB' is not a quantity",
            id="limit-not-a-quantity",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": True}}}),
            "GpuConfig: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0] True is not a quantity",
            id="per-device-limit-type",
        ),
        pytest.param(gpu_config([]), "GpuConfig: sharing is not an object", id="sharing-not-an-object"),
    ],
)
def test_bad_configs_are_one_line(parameters: Any, message: str) -> None:
    with pytest.raises(ClaimError, match=f"^{re.escape('ResourceClaim ns/c: ' + message)}$"):
        parse(parameters, REF)


def test_class_configs_first_and_other_drivers_skipped() -> None:
    slicing = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
    claim = claim_with(
        opaque(gpu_config({"strategy": "MPS"}), ["b"]),
        {"source": "FromClaim", "opaque": {"driver": "nic.example.com", "parameters": {"kind": "X"}}},
        opaque(slicing, ["a"], source="FromClass"),
    )
    assert opaque_configs(claim, REF) == [
        OpaqueConfig(("a",), DeviceSharing("GpuConfig", "TimeSlicing", "Short")),
        OpaqueConfig(("b",), DeviceSharing("GpuConfig", "MPS", mps=MpsSettings())),
    ]
    with pytest.raises(ClaimError, match="^ResourceClaim ns/c: a config's source 'FromPod' is not FromClass"):
        opaque_configs(claim_with(opaque(slicing, source="FromPod")), REF)


def test_precedence_per_request_and_kind() -> None:
    short = DeviceSharing("GpuConfig", "TimeSlicing", "Short")
    long = DeviceSharing("GpuConfig", "TimeSlicing", "Long")
    mig_mps = DeviceSharing("MigDeviceConfig", "MPS", mps=MpsSettings(50))
    configs = [
        OpaqueConfig((), short),  # the class's: every request
        OpaqueConfig((), mig_mps),  # every request with a MIG device
        OpaqueConfig(("b",), long),  # the claim's, for request b
        OpaqueConfig(("c",), DeviceSharing("GpuConfig")),  # request c: explicitly no sharing
    ]
    allocated = [
        Allocated("a", "gpu-0"),
        Allocated("b/small", "gpu-1"),  # a subrequest of b
        Allocated("c", "gpu-2"),
        Allocated("a", "gpu-3-mig-1g5gb-0"),
    ]
    groups = resolve(configs, allocated, lambda name: "-mig-" in name, REF)
    assert groups == [
        (short, [Allocated("a", "gpu-0")]),
        (mig_mps, [Allocated("a", "gpu-3-mig-1g5gb-0")]),
        (long, [Allocated("b/small", "gpu-1")]),
    ]
    wrong = [OpaqueConfig(("a",), DeviceSharing("GpuConfig", "MPS", mps=MpsSettings()))]
    message = "ResourceClaim ns/c: a GpuConfig cannot apply to MIG device gpu-3-mig-1g5gb-0 (request a)"
    with pytest.raises(ClaimError, match=f"^{re.escape(message)}$"):
        resolve(wrong, allocated[3:], lambda name: "-mig-" in name, REF)
    assert (
        resolve(
            [OpaqueConfig((), DeviceSharing("MigDeviceConfig", "MPS"))], allocated[:1], lambda _: False, REF
        )
        == []
    )


def test_per_device_memory_limits() -> None:
    settings = MpsSettings(None, 8 << 30, (("1", 2 << 30), ("GPU-a", 4 << 30)))
    assert settings.pinned_memory(["GPU-a", "GPU-b"]) == {"GPU-a": 4 << 30, "GPU-b": 2 << 30}
    message = (
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: key '1' names no device of the 1 it applies to "
        "(an index from 0, or a UUID)"
    )
    with pytest.raises(ConfigProblem, match=f"^{re.escape(message)}$"):
        settings.pinned_memory(["GPU-a"])


def test_the_stand_in_scheduler_copies_class_then_claim_configs() -> None:
    parameters = gpu_config({"strategy": "TimeSlicing"})
    classes = {
        "gpu.nvidia.com": {"spec": {"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]}}
    }
    claim = {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}
                ],
            }
        }
    }
    assert allocation_config(claim, classes) == [
        {
            "source": "FromClass",
            "requests": ["gpu"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": {}},
        },
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
        },
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("4Gi", 4 << 30), ("512Mi", 512 << 20), ("1G", 10**9), ("1e9", 10**9), ("0.5Gi", 1 << 29), ("1.5", 2),
     ("25", 25), ("500m", 1), ("2k", 2000), ("0", 0), (7, 7), ("1e30", 10**30), ("1e-999999999", 0)],
    ids=str,
)  # fmt: skip
def test_quantities(text: object, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "4GB", "1e", "x", "1 Gi", "-", None, "1.2.3", True], ids=repr)
def test_not_quantities(text: object) -> None:
    with pytest.raises(ValueError, match="^invalid quantity$"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e999999999", "1E31", "1e999999", "10000000000000Ei"])
def test_a_huge_quantity_is_refused_at_once(text: str) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match="^quantity out of range$"):
        parse_quantity(text)
    assert time.monotonic() - started < 0.5  # no 10**999999999 computed first


def test_nvidia_smi_of_the_driver_root_sets_the_time_slice(tmp_path: Path) -> None:
    root = tmp_path / "driver-root"
    smi, library = root / "usr/bin/nvidia-smi", root / "usr/lib64/libnvidia-ml.so.1"
    for path in (smi, library):
        path.parent.mkdir(parents=True)
    library.write_bytes(b"")
    record = tmp_path / "calls"
    smi.write_text(
        f'#!/bin/sh\necho "$* LD_PRELOAD=$LD_PRELOAD" >> {record}\n'
        '[ "$5" = 3 ] && { echo "Failed to set the time slice: Insufficient Permissions" >&2; exit 4; }\n'
        "exit 0\n"
    )
    smi.chmod(0o755)
    slicer = NvidiaSmi.of_root(str(root), {"PATH": os.environ["PATH"]})
    slicer.set_timeslice("GPU-a", "Medium")
    assert record.read_text() == f"compute-policy -i GPU-a --set-timeslice 2 LD_PRELOAD={library}\n"
    message = "nvidia-smi compute-policy -i GPU-a: Failed to set the time slice: Insufficient Permissions"
    with pytest.raises(TimeSliceError, match=f"^{re.escape(message)}$"):
        slicer.set_timeslice("GPU-a", "Long")
    missing = NvidiaSmi.of_root(str(tmp_path / "none"), {"PATH": str(tmp_path)})
    cannot = "^nvidia-smi compute-policy: cannot run nvidia-smi: No such file"
    with pytest.raises(TimeSliceError, match=cannot):
        missing.set_timeslice("GPU-a", "Short")
