"""The command line as a new user meets it: a bad command line is one line on stderr (no usage dump,
no traceback) naming the command that refused it, and every command answers --version."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nvdp import __version__
from nvdp.cli import (
    config_manager_main,
    dra_kubelet_plugin_main,
    gfd_main,
    main,
    mps_control_daemon_main,
    plugin_main,
)
from testkit import REPO
from tests.test_simulate import run_simulate

Entry = Callable[[Sequence[str] | None], int]


def _exit(entry: Entry, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        entry(argv)
    out, err = capsys.readouterr()
    assert isinstance(exited.value.code, int)
    return exited.value.code, out, err


@pytest.mark.parametrize(
    ("entry", "argv", "line"),
    [
        pytest.param(
            main,
            ["plugin", "--bogus"],
            "nvdp plugin: error: unrecognized arguments: --bogus (see nvdp plugin --help)",
            id="nvdp-plugin",
        ),
        pytest.param(
            plugin_main,
            ["--bogus"],
            "nvidia-device-plugin: error: unrecognized arguments: --bogus (see nvidia-device-plugin --help)",
            id="nvidia-device-plugin",
        ),
        pytest.param(
            main,
            ["gfd", "--bogus"],
            "nvdp gfd: error: unrecognized arguments: --bogus (see nvdp gfd --help)",
            id="nvdp-gfd",
        ),
        pytest.param(
            gfd_main,
            ["-z"],
            "gpu-feature-discovery: error: unrecognized arguments: -z (see gpu-feature-discovery --help)",
            id="gpu-feature-discovery",
        ),
        pytest.param(
            main,
            ["config-manager", "--bogus"],
            "nvdp config-manager: error: unrecognized arguments: --bogus (see nvdp config-manager --help)",
            id="config-manager",
        ),
        pytest.param(
            main,
            ["mps-control-daemon", "--bogus"],
            "nvdp mps-control-daemon: error: unrecognized arguments: --bogus"
            " (see nvdp mps-control-daemon --help)",
            id="nvdp-mps-control-daemon",
        ),
        pytest.param(
            mps_control_daemon_main,
            ["--bogus"],
            "mps-control-daemon: error: unrecognized arguments: --bogus (see mps-control-daemon --help)",
            id="mps-control-daemon",
        ),
        pytest.param(
            config_manager_main,
            ["--bogus"],
            "config-manager: error: unrecognized arguments: --bogus (see config-manager --help)",
            id="config-manager-script",
        ),
        pytest.param(
            dra_kubelet_plugin_main,
            ["--bogus"],
            "gpu-kubelet-plugin: error: unrecognized arguments: --bogus (see gpu-kubelet-plugin --help)",
            id="gpu-kubelet-plugin",
        ),
        pytest.param(
            main,
            ["simulate", "--profile", "nope"],
            "nvdp simulate: error: argument --profile: invalid choice: 'nope' (choose from 'dgx-a100',"
            " 'dgx-a100-mig', 'dgx-a100-mig-empty', 'pcie-4', 'dgx-h100') (see nvdp simulate --help)",
            id="simulate-choice",
        ),
        pytest.param(
            main,
            ["plugin", "--mig-strategy"],
            "nvdp plugin: error: argument --mig-strategy: expected one argument (see nvdp plugin --help)",
            id="missing-value",
        ),
        pytest.param(
            main,
            ["config", "check"],
            "nvdp config check: error: the following arguments are required: FILE"
            " (see nvdp config check --help)",
            id="config-check-no-file",
        ),
        pytest.param(
            main,
            [],
            "nvdp: error: the following arguments are required: COMMAND (see nvdp --help)",
            id="no-command",
        ),
    ],
)
def test_bad_command_line_is_one_line(
    entry: Entry, argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _exit(entry, argv, capsys)
    assert (code, out, err) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("entry", "argv"),
    [
        pytest.param(main, ["--version"], id="nvdp"),
        pytest.param(main, ["plugin", "--version"], id="plugin"),
        pytest.param(main, ["simulate", "--version"], id="simulate"),
        pytest.param(main, ["gfd", "--version"], id="gfd"),
        pytest.param(main, ["config-manager", "--version"], id="config-manager"),
        pytest.param(main, ["config", "check", "--version"], id="config-check"),
        pytest.param(main, ["mps-control-daemon", "--version"], id="mps-control-daemon"),
        pytest.param(plugin_main, ["--version"], id="nvidia-device-plugin"),
        pytest.param(gfd_main, ["--version"], id="gpu-feature-discovery"),
        pytest.param(mps_control_daemon_main, ["--version"], id="mps-control-daemon-script"),
        pytest.param(main, ["dra-kubelet-plugin", "--version"], id="dra-kubelet-plugin"),
        pytest.param(dra_kubelet_plugin_main, ["--version"], id="gpu-kubelet-plugin"),
        pytest.param(config_manager_main, ["--version"], id="config-manager-script"),
    ],
)
def test_every_command_answers_version(
    entry: Entry, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit(entry, argv, capsys) == (0, f"nvdp {__version__}\n", "")


def test_config_check_names_a_bad_nvml_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    assert main(["config", "check", "--nvml", "sim:nope", str(path)]) == 1
    assert capsys.readouterr().err == (
        "error: --nvml sim:nope: unknown simulated node profile 'nope'; accepted: dgx-a100, dgx-a100-mig,"
        " dgx-a100-mig-empty, dgx-h100, gb200-nvl, pcie-4, or sim:/path/to/node.yaml\n"
    )


def test_simulate_suggests_only_what_this_run_did_not_do(tmp_path: Path) -> None:
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    )
    result = run_simulate("--profile", "pcie-4", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(
        "That is what a kubelet sees from this node. Try: --profile dgx-a100-mig --mig-strategy mixed, or"
        " --serve with NVDP_SIM_EVENTS to inject GPU faults (see README).\n"
    )
    assert "(that device) -> container answer" in result.stdout  # not "those 1 devices"


def test_simulate_with_cdi_says_why_nothing_is_advertised(tmp_path: Path) -> None:
    result = run_simulate("--device-list-strategy", "cdi-cri")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(
        "No resources advertised for the 8 GPUs found: the warnings above say why.\n"
        "A CDI strategy needs the GPUs' device nodes (/dev/nvidia0, ...) under --dev-root, and a"
        " simulated node has none: point --dev-root at a directory holding files of those names.\n"
    )
    (tmp_path / "dev").mkdir()
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl"]:
        (tmp_path / "dev" / name).touch()
    result = run_simulate("--device-list-strategy", "cdi-cri", "--dev-root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (
        "  cdi        k8s.device-plugin.nvidia.com/gpu=GPU-925be680-6786-5653-edfc-0f1c7087259e\n"
        in result.stdout
    )


def test_nvidia_resource_name_prefix_is_accepted_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from nvdp.config import add_plugin_flags, resolve

    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    given = resolve(parser.parse_args(["--resource-name-prefix", "nvidia.com"]), {})
    from_env = resolve(parser.parse_args([]), {"RESOURCE_NAME_PREFIX": "nvidia.com"})
    assert given.runtime.resource_name_prefix == from_env.runtime.resource_name_prefix == "nvidia.com"
    assert main(["plugin", "--nvml", "sim:pcie-4", "--resource-name-prefix", "example.com"]) == 1
    assert capsys.readouterr().err == (
        'error: --resource-name-prefix / RESOURCE_NAME_PREFIX: "example.com" is not supported by nvdp'
        " (only nvidia.com)\n"
    )


def test_simulate_into_a_closed_pipe_is_no_traceback() -> None:
    """`nvdp simulate | head -1`: the reader goes away; the demo stops without a traceback."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvdp.cli", "simulate"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    os.close(write_end)
    os.close(read_end)  # gone before the demo writes its first line
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (1, "")


@pytest.mark.parametrize(
    ("env", "value", "line"),
    [
        pytest.param(
            "LOG_LEVEL",
            "verbose",
            'error: LOG_LEVEL: invalid value "verbose" (accepted: debug, info, warning, error)',
            id="level",
        ),
        pytest.param(
            "LOG_FORMAT", "xml", 'error: LOG_FORMAT: invalid value "xml" (accepted: text, json)', id="format"
        ),
    ],
)
def test_config_manager_refuses_a_bad_log_env_value(
    env: str,
    value: str,
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(env, value)
    argv = ["config-manager", "--oneshot", "--node-name", "n1", "--config-file-srcdir", str(tmp_path)]
    assert main([*argv, "--config-file-dst", str(tmp_path / "config.yaml")]) == 1
    assert capsys.readouterr().err == line + "\n"


def test_nvidia_binary_names_are_console_scripts() -> None:
    """The image answers to NVIDIA's binary names (a chart or manifest written for NVIDIA's image runs
    them by name): the plugin, gfd, the MPS control daemon, the config-manager, the DRA kubelet plugin."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {name: scripts.get(name) for name in NVIDIA_NAMES} == NVIDIA_NAMES


NVIDIA_NAMES = {
    "nvidia-device-plugin": "nvdp.cli:plugin_main",
    "gpu-feature-discovery": "nvdp.cli:gfd_main",
    "mps-control-daemon": "nvdp.cli:mps_control_daemon_main",
    "config-manager": "nvdp.cli:config_manager_main",
    "gpu-kubelet-plugin": "nvdp.cli:dra_kubelet_plugin_main",
}
