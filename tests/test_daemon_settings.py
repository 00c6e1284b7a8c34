"""Mapping the resolved config onto the daemon (nvdp.plugins.deviceplugin.daemon_settings, pure and total),
and the settings nvdp
refuses (nvdp.config.rules, through resolve: every problem at once)."""

from __future__ import annotations

import argparse

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import add_plugin_flags, parse_text, resolve
from nvdp.plugins.deviceplugin.daemon_settings import daemon_settings


def config_from(argv: list[str], text: str | None = None, tmp_path=None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    args = parser.parse_args(argv)
    if text is None:
        return resolve(args, {}).config
    return resolve(
        args, {"CONFIG_FILE": "inline.yaml"}, file_loader=lambda path: parse_text(text, path)
    ).config


def test_flags_reach_the_response_options() -> None:
    settings = daemon_settings(
        config_from(
            [
                "--device-id-strategy",
                "index",
                "--pass-device-specs",
                "--gds-enabled",
                "--mofed-enabled",
                "--kubelet-socket",
                "/k/kubelet.sock",
                "--nvidia-driver-root",
                "/run/nvidia/driver",
            ]
        )
    )
    assert str(settings.kubelet_socket) == "/k/kubelet.sock"
    assert settings.response.device_id_strategy == "index"
    assert settings.response.pass_device_specs
    assert settings.dev_root == "/run/nvidia/driver"
    assert settings.response.extra_envs == (("NVIDIA_GDS", "enabled"), ("NVIDIA_MOFED", "enabled"))


def test_time_slicing_rule() -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - name: gpu\n      replicas: 5\n"
    )
    (rule,) = daemon_settings(config_from([], text)).rules.sharing
    assert (rule.name, rule.replicas, rule.rename, rule.strategy) == (
        "nvidia.com/gpu",
        5,
        "nvidia.com/gpu.shared",
        "time-slicing",
    )


@pytest.mark.parametrize(
    ("argv", "text", "message"),
    [
        pytest.param(
            ["--device-discovery-strategy", "tegra"], None, "tegra is not supported by nvdp", id="tegra"
        ),
    ],
)
def test_refused_settings(argv: list[str], text: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from(argv, text)


def test_reload_with_the_same_gpus_does_not_rearm_the_health_monitor() -> None:
    from nvdp.node.health import HealthSettings
    from nvdp.node.health.node import NodeHealth
    from nvdp.node.nvml import open_nvml

    nvml = open_nvml("sim:pcie-4")
    nvml.init()
    try:
        gpus = nvml.gpus()
        health = NodeHealth(nvml, HealthSettings(), {})
        handed: list[int] = []
        health.start(gpus, None)
        assert health.monitor is not None
        health.monitor.update_gpus = lambda new, gone=(): handed.append(len(new))  # type: ignore[method-assign]
        health.start(list(gpus), None)  # SIGHUP, same node
        assert handed == []
        health.start(gpus[:2], None)  # a GPU disappeared
        assert handed == [2]
        health.stop()
    finally:
        nvml.shutdown()


def test_the_mapping_is_total_even_for_refused_configs() -> None:
    """Refusing is the config validation's job (nvdp.config.rules); the mapping never raises."""
    from nvdp.config import Config, Flags, PluginFlags

    config = Config(
        flags=Flags(
            device_discovery_strategy="tegra",
            nvidia_driver_root="/run/nvidia/driver",
            plugin=PluginFlags(kubelet_socket=""),
        )
    )
    settings = daemon_settings(config)
    assert settings.dev_root == "/run/nvidia/driver"  # unresolved nvidiaDevRoot follows the driver root
    assert settings.response.dev_root == settings.dev_root


def test_health_section_and_imex_channels() -> None:
    from nvdp.node.health import HealthSettings

    text = (
        "version: v1\nimex:\n  channelIDs: [0]\nhealth:\n  ignoredXids: [13]\n  fatalXids: [79]\n"
        "  recoveryQuietPeriod: 1m\n  probeInterval: 2s\n  singleBitEcc: true\n"
    )
    settings = daemon_settings(config_from(["--gdrcopy-enabled"], text), imex_channels=(0,))
    assert settings.health == HealthSettings(
        ignored_xids=frozenset({13}),
        fatal_xids=frozenset({79}),
        recovery_quiet_period=60.0,
        probe_interval=2.0,
        single_bit_ecc=True,
    )
    assert settings.response.extra_envs == (("NVIDIA_GDRCOPY", "enabled"),)
    assert settings.response.imex_channels == (0,)  # present on the node (the caller looked)


def test_no_sharing_and_default_health() -> None:
    from nvdp.node.health import HealthSettings

    settings = daemon_settings(config_from([]))
    assert settings.rules.sharing == ()
    assert settings.health == HealthSettings()
    assert settings.response.control_devices == ()  # node facts are the supervisor's to read


def test_every_refusal_at_once() -> None:
    text = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"
    with pytest.raises(ConfigError) as caught:
        config_from(["--device-discovery-strategy", "tegra"], text)
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY",
        "sharing.mps",
    ]
