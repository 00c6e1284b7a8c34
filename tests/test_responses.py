"""Allocate answers per device-list / device-id strategy (pure)."""

from __future__ import annotations

import pytest

from nvdp.plugins.deviceplugin.host_facts import present_control_devices
from nvdp.plugins.deviceplugin.responses import ResponseOptions, container_response
from tests.builders import device, full_gpu


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [pytest.param("uuid", "GPU-0,GPU-3", id="uuid"), pytest.param("index", "0,3", id="index")],
)
def test_envvar(strategy: str, expected: str) -> None:
    r = container_response(
        [device(full_gpu(0)), device(full_gpu(3))], ResponseOptions(device_id_strategy=strategy), ""
    )
    assert dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": expected}
    assert not r.devices and not r.mounts and not r.cdi_devices


def test_replicas_collapse_to_one_visible_device() -> None:
    r = container_response(
        [device(full_gpu(1), replica=0), device(full_gpu(1), replica=3)], ResponseOptions(), ""
    )
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"


def test_volume_mounts() -> None:
    r = container_response(
        [device(full_gpu(0)), device(full_gpu(1))],
        ResponseOptions(device_list_strategy=("volume-mounts",)),
        "",
    )
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [(m.container_path, m.host_path) for m in r.mounts] == [
        ("/var/run/nvidia-container-devices/GPU-0", "/dev/null"),
        ("/var/run/nvidia-container-devices/GPU-1", "/dev/null"),
    ]


def test_cdi_annotations_and_cri() -> None:
    options = ResponseOptions(device_list_strategy=("cdi-annotations", "cdi-cri"))
    r = container_response([device(full_gpu(0)), device(full_gpu(1))], options, "abc")
    assert dict(r.annotations) == {
        "cdi.k8s.io/nvidia-device-plugin_abc": "k8s.device-plugin.nvidia.com/gpu=GPU-0,"
        "k8s.device-plugin.nvidia.com/gpu=GPU-1"
    }
    assert [c.name for c in r.cdi_devices] == [
        "k8s.device-plugin.nvidia.com/gpu=GPU-0",
        "k8s.device-plugin.nvidia.com/gpu=GPU-1",
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in r.envs


def test_device_specs_with_dev_root(tmp_path) -> None:
    (tmp_path / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).touch()
    controls = present_control_devices(str(tmp_path))
    assert controls == ("/dev/nvidiactl", "/dev/nvidia-uvm")
    options = ResponseOptions(pass_device_specs=True, dev_root=str(tmp_path), control_devices=controls)
    r = container_response([device(full_gpu(2))], options, "")
    assert [(d.container_path, d.host_path, d.permissions) for d in r.devices] == [
        ("/dev/nvidiactl", f"{tmp_path}/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{tmp_path}/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia2", f"{tmp_path}/dev/nvidia2", "rw"),
    ]


def test_feature_envs_are_added() -> None:
    options = ResponseOptions(extra_envs=(("NVIDIA_GDS", "enabled"),), imex_channels=(0, 3))
    r = container_response([device(full_gpu(0))], options, "")
    assert dict(r.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-0",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_IMEX_CHANNELS": "0,3",
    }


CDI_ONLY = [("cdi-annotations",), ("cdi-cri",), ("cdi-annotations", "cdi-cri")]


@pytest.mark.parametrize("strategies", CDI_ONLY, ids=["annotations", "cri", "both"])
def test_cdi_alone_names_cdi_devices_and_nothing_the_cdi_devices_inject(strategies: tuple[str, ...]) -> None:
    """NVIDIA's plugin: with CDI strategies only, no device specs (the CDI device injects the nodes),
    no device list or IMEX channel env var, no volume mounts; the GDS / MOFED / GDRCopy switches stay."""
    options = ResponseOptions(
        device_list_strategy=strategies,
        pass_device_specs=True,
        control_devices=("/dev/nvidiactl",),
        extra_envs=(("NVIDIA_GDS", "enabled"),),
        imex_channels=(0,),
    )
    r = container_response([device(full_gpu(0))], options, "abc")
    assert not r.devices and not r.mounts
    assert dict(r.envs) == {"NVIDIA_GDS": "enabled"}
    assert bool(r.cdi_devices) == ("cdi-cri" in strategies)
    assert bool(r.annotations) == ("cdi-annotations" in strategies)


@pytest.mark.parametrize("other", ["envvar", "volume-mounts"])
def test_cdi_with_another_strategy_keeps_the_device_specs(other: str) -> None:
    options = ResponseOptions(
        device_list_strategy=("cdi-cri", other), pass_device_specs=True, control_devices=("/dev/nvidiactl",)
    )
    r = container_response([device(full_gpu(1))], options, "")
    assert [d.container_path for d in r.devices] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert [c.name for c in r.cdi_devices] == ["k8s.device-plugin.nvidia.com/gpu=GPU-1"]


def test_imex_channels_go_with_the_strategy_that_names_devices() -> None:
    """NVIDIA's plugin: the channels' env var with `envvar`; with `volume-mounts`, a mount per channel
    under imex/ instead."""
    options = ResponseOptions(device_list_strategy=("volume-mounts",), imex_channels=(0,))
    r = container_response([device(full_gpu(0))], options, "")
    assert "NVIDIA_IMEX_CHANNELS" not in r.envs
    assert [m.container_path for m in r.mounts] == [
        "/var/run/nvidia-container-devices/GPU-0",
        "/var/run/nvidia-container-devices/imex/0",
    ]
