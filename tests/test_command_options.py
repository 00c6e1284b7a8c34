"""Every command's flags come from one framework (nvdp.config.options): walked over the parsers users
meet, each flag is a declared option with its env vars (where NVIDIA has one) and help, its default
shown once and equal to the settings' default; the NVIDIA-named console scripts take the same flags."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.cli import (
    build_parser,
    config_manager_main,
    dra_kubelet_plugin_main,
    gfd_main,
    main,
    mps_control_daemon_main,
    plugin_main,
)
from nvdp.config import PLUGIN_OPTIONS, PluginOptions
from nvdp.config.options import Option
from nvdp.node.mps.command import MPS_OPTIONS, MpsOptions
from nvdp.node.mps.command import add_arguments as add_mps_arguments
from nvdp.node.mps.command import resolve as resolve_mps
from nvdp.plugins.dra.options import DRA_OPTIONS, DraSettings
from nvdp.plugins.ledger.status import STATUS_OPTIONS, StatusFlags
from nvdp.plugins.uninstall import DELETE_DAEMONSETS_OPTIONS, DeleteDaemonSetsFlags
from nvdp.side.configmanager.check import CHECK_OPTIONS, CheckFlags
from nvdp.side.configmanager.settings import OPTIONS as MANAGER_OPTIONS
from nvdp.side.configmanager.settings import Settings as ManagerSettings
from nvdp.side.gfd.options import GFD_OPTIONS, GfdSettings, add_gfd_flags, resolve_gfd

# command -> (its options, its settings class)
COMMANDS: dict[str, tuple[tuple[Option, ...], type]] = {
    "plugin": (PLUGIN_OPTIONS, PluginOptions),
    "simulate": (PLUGIN_OPTIONS, PluginOptions),
    "gfd": (GFD_OPTIONS, GfdSettings),
    "mps-control-daemon": (MPS_OPTIONS, MpsOptions),
    "status": (STATUS_OPTIONS, StatusFlags),
    "dra-kubelet-plugin": (DRA_OPTIONS, DraSettings),
    "config-manager": (MANAGER_OPTIONS, ManagerSettings),
    "config check": (CHECK_OPTIONS, CheckFlags),
    "delete-daemonsets": (DELETE_DAEMONSETS_OPTIONS, DeleteDaemonSetsFlags),
}
NO_ENV = {"config check"}  # nvdp's own command: flags only, an operator's env must not change a check
DEMO_FLAGS = {
    "--profile",
    "--serve",
    "--api",
}  # `nvdp simulate`'s own: argparse choices, no setting behind them


def parsers() -> dict[str, argparse.ArgumentParser]:
    _, commands = build_parser()
    found = dict(commands)
    (tools,) = (a for a in found.pop("config")._actions if isinstance(a, argparse._SubParsersAction))
    found["config check"] = tools.choices["check"]
    return found


def flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    skipped = {"help", "version"}
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in skipped}


def settings_default(settings: type, target: str) -> object:
    head, _, rest = target.partition(".")
    field = next(f for f in fields(settings) if f.name == head)
    value = field.default_factory() if field.default_factory is not MISSING else field.default
    for name in rest.split(".") if rest else ():
        value = getattr(value, name)
    return None if value is MISSING else value


def test_every_command_is_walked() -> None:
    assert set(parsers()) == set(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_flag_is_a_declared_option_with_env_and_help(command: str) -> None:
    options, settings = COMMANDS[command]
    actions = flag_actions(parsers()[command])
    flagged = {o.dest: o for o in options if o.has_flag}
    demo = (
        {d for d, a in actions.items() if set(a.option_strings) <= DEMO_FLAGS}
        if command == "simulate"
        else set()
    )
    assert set(actions) - demo == set(flagged)
    for dest, option in flagged.items():
        action = actions[dest]
        assert tuple(action.option_strings) == option.names
        assert action.default is None  # a flag not given is told from a given one
        help = str(action.help)
        assert option.help and help.startswith(option.help.replace("%", "%%"))
        if command in NO_ENV:
            assert option.envs == () and "[env " not in help
        else:
            assert option.envs and f"[env {', '.join(option.envs)}" in help, dest
        settings_default(settings, option.field)  # the target is a field of the command's settings


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_default_is_shown_once_and_is_the_settings_default(command: str) -> None:
    options, settings = COMMANDS[command]
    actions = flag_actions(parsers()[command])
    for option in (o for o in options if o.has_flag):
        help = str(actions[option.dest].help)
        assert sum(help.count(shown) for shown in ("(default", "[default ", "; default ")) <= 1, help
        default = settings_default(settings, option.field)
        if default is None:
            assert "default " not in help.rpartition("[")[2], help
            continue
        shown = help.rpartition("default ")[2].removesuffix("]")
        if isinstance(default, bool):
            assert shown == str(default).lower()
        elif isinstance(default, float | int):
            assert float(shown.removesuffix("s")) == default
        else:
            joined = default if isinstance(default, str) else ",".join(map(str, default))  # type: ignore[arg-type]
            assert shown == f'"{joined}"'


@pytest.mark.parametrize(
    ("entry", "command"),
    [
        pytest.param(plugin_main, "plugin", id="nvidia-device-plugin"),
        pytest.param(gfd_main, "gfd", id="gpu-feature-discovery"),
        pytest.param(mps_control_daemon_main, "mps-control-daemon", id="mps-control-daemon"),
        pytest.param(dra_kubelet_plugin_main, "dra-kubelet-plugin", id="gpu-kubelet-plugin"),
        pytest.param(config_manager_main, "config-manager", id="config-manager"),
    ],
)
def test_nvidia_named_scripts_take_the_commands_flags(
    entry: object, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        entry(["--help"])  # type: ignore[operator]
    script_help = capsys.readouterr().out
    options, _ = COMMANDS[command]
    for option in (o for o in options if o.has_flag):
        for name in option.names:
            assert name in script_help
    assert (
        " ".join(parsers()[command].format_help().split()).split("options: ", 1)[1]
        == (" ".join(script_help.split()).split("options: ", 1)[1])
    )


# ---- what the one framework brought to each command ------------------------------------------


def test_config_manager_takes_the_logging_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config-manager", "--oneshot", "--node-name", "n1", "--config-file-srcdir", str(tmp_path)]
    argv += ["--config-file-dst", str(tmp_path / "config.yaml"), "--log-level", "verbose"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        'error: --log-level: invalid value "verbose" (accepted: debug, info, warning, error)\n'
    )


def test_config_check_refuses_a_bad_mig_strategy_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    assert main(["config", "check", str(path), "--mig-strategy", "all"]) == 1
    assert capsys.readouterr().err == (
        'error: --mig-strategy: invalid value "all" (accepted: none, single, mixed)\n'
    )


def test_config_check_reads_no_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    monkeypatch.setenv("NVDP_NVML", "sim:pcie-4")
    monkeypatch.setenv("MIG_STRATEGY", "bogus")
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"


def test_a_bad_gfd_env_value_is_named_by_the_variable_read() -> None:
    parser = argparse.ArgumentParser()
    add_gfd_flags(parser)
    with pytest.raises(ConfigError) as raised:
        resolve_gfd(
            parser.parse_args([]), {"GFD_MIG_STRATEGY": "all", "MIG_STRATEGY": "none"}, "/nonexistent"
        )
    assert raised.value.problems == [
        '--mig-strategy / GFD_MIG_STRATEGY: invalid value "all" (accepted: none, single, mixed)'
    ]
    assert "[env GFD_MIG_STRATEGY, MIG_STRATEGY; default" in " ".join(parser.format_help().split())


def test_mps_daemon_reports_every_bad_value_at_once() -> None:
    parser = argparse.ArgumentParser()
    add_mps_arguments(parser)
    args = parser.parse_args(["--mig-strategy", "all", "--mps-health-interval", "0s"])
    with pytest.raises(ConfigError) as raised:
        resolve_mps(args, {})
    assert raised.value.problems == [
        '--mig-strategy / MIG_STRATEGY: invalid value "all" (accepted: none, single, mixed)',
        '--mps-health-interval: must be > 0, got "0s"',
    ]
