"""`nvdp dra-kubelet-plugin` as a command: NVIDIA's flag and env names, every bad setting one line and
exit 1 (all at once), a missing kubeconfig one line; SIGTERM stops it cleanly (sockets gone, slices
left for the next pod), SIGHUP re-reads the GPUs; a server that cannot listen is retried."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.cli import main
from nvdp.plugins.dra.options import add_dra_flags, resolve_dra
from testkit import clean_env, wait_until
from tests.dra_support import dra_cluster, slices_of


def dra_settings_of(argv: list[str], environ: dict[str, str]) -> object:
    parser = argparse.ArgumentParser()
    add_dra_flags(parser)
    return resolve_dra(parser.parse_args(argv), environ)


def test_nvidias_env_names_and_defaults() -> None:
    settings = dra_settings_of(
        [],
        {
            "NODE_NAME": "n1",
            "CDI_ROOT": "/var/run/cdi",
            "KUBELET_REGISTRAR_DIRECTORY_PATH": "/k/reg",
            "KUBELET_PLUGINS_DIRECTORY_PATH": "/k/plugins",
            "KUBECONFIG": "/k/config",
            "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
            "CONTAINER_DRIVER_ROOT": "/driver-root",
        },
    )
    assert str(settings.registration_socket) == "/k/reg/gpu.nvidia.com-reg.sock"  # type: ignore[attr-defined]
    assert str(settings.plugin_socket) == "/k/plugins/gpu.nvidia.com/dra.sock"  # type: ignore[attr-defined]
    assert (settings.cdi_root, settings.kubeconfig) == ("/var/run/cdi", "/k/config")  # type: ignore[attr-defined]
    assert settings.config.flags.nvidia_driver_root == "/run/nvidia/driver"  # type: ignore[attr-defined]
    defaults = dra_settings_of(["--node-name", "n1"], {})
    assert (defaults.cdi_root, str(defaults.plugin_dir)) == (
        "/etc/cdi",
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
    )  # type: ignore[attr-defined]
    assert defaults.runtime.device_rescan_interval == 0.5  # type: ignore[attr-defined]


def test_the_metrics_address_is_the_plugins_flag_env_and_default() -> None:
    def address(argv: list[str], environ: dict[str, str]) -> str:
        return dra_settings_of(["--node-name", "n1", *argv], environ).runtime.metrics_address  # type: ignore[attr-defined,no-any-return]

    assert address([], {}) == ":2112"
    assert address([], {"METRICS_ADDRESS": ":2113"}) == ":2113"
    assert address(["--metrics-address", ""], {"METRICS_ADDRESS": ":2113"}) == ""
    with pytest.raises(ConfigError) as raised:
        dra_settings_of(["--node-name", "n1"], {"METRICS_ADDRESS": "2113"})
    assert raised.value.problems == [
        '--metrics-address / METRICS_ADDRESS: invalid address "2113"'
        ' (expected "[host]:port", or "" to disable)'
    ]


def test_every_bad_setting_is_one_line_all_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        dra_settings_of(["--kubelet-plugins-directory-path", "plugins", "--log-level", "loud"], {})
    assert raised.value.problems == [
        '--log-level / LOG_LEVEL: invalid value "loud" (accepted: debug, info, warning, error)',
        "--node-name / NODE_NAME: required (the node whose GPUs are published)",
        "--kubelet-plugins-directory-path / KUBELET_PLUGINS_DIRECTORY_PATH: must be an absolute path, "
        "got 'plugins'",
    ]
    long = "/" + "d" * 100
    with pytest.raises(ConfigError, match="longer than 107 bytes"):
        dra_settings_of(["--node-name", "n", "--kubelet-registrar-directory-path", long], {})


def test_the_command_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dra-kubelet-plugin", "--nvml", "sim:pcie-4"]) == 1
    assert (
        capsys.readouterr().err
        == "error: --node-name / NODE_NAME: required (the node whose GPUs are published)\n"
    )
    # past the settings, logging is set up: the rest in a process of its own
    argv = [sys.executable, "-m", "nvdp.cli", "dra-kubelet-plugin", "--node-name", "n1"]
    argv += ["--kubeconfig", str(tmp_path / "none")]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (
        1,
        f"error: cannot load kubeconfig {tmp_path / 'none'}: no such file\n",
    )


def test_sigterm_stops_cleanly_and_sighup_reads_the_gpus_again(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slice")
        assert process.log().count("GPUs enumerated") == 1
        process.send(signal.SIGHUP)
        wait_until(lambda: process.log().count("GPUs enumerated") == 2, 5, "the GPUs read again")
        assert process.alive()
        process.send(signal.SIGTERM)
        assert process.wait(10) == 0
        assert list(cluster.node.registry.iterdir()) == []
        assert not (cluster.node.plugins / "gpu.nvidia.com" / "dra.sock").exists()
        assert slices_of(cluster.api)  # left for the next pod: the kubelet wipes them if none comes
        assert "stopped nvdp dra-kubelet-plugin node=node-a" in process.log()


def test_a_registration_directory_it_cannot_write_is_retried(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        cluster.watcher.stop()
        cluster.node.registry.rmdir()
        cluster.node.registry.write_text("a file where the directory should be")
        process = cluster.start()
        wait_until(lambda: "plugin server cannot listen; retrying" in process.log(), 10, "the failure said")
        cluster.node.registry.unlink()
        cluster.node.registry.mkdir()
        cluster.watcher.start()
        cluster.registered()
        assert "plugin server listening again" in process.log()
