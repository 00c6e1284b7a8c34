"""Flags and env vars: NVIDIA's names and defaults, flag > env > file > default, every problem at once."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import PLUGIN_OPTIONS, Config, Flags, PluginOptions, add_plugin_flags, parse_text, resolve

DATA = Path(__file__).parent / "data" / "config"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvidia-device-plugin")
    add_plugin_flags(p)
    return p


def run(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, file: str | None = None
) -> PluginOptions:
    """Resolve with an in-memory config file (its path is whatever --config-file / CONFIG_FILE says)."""
    files = {"/etc/nvdp/config.yaml": file} if file is not None else {}

    def loader(path: str) -> Config:
        return parse_text(files[path], source=path)

    return resolve(parser().parse_args(list(argv)), env or {}, file_loader=loader)


def errors(
    argv: Sequence[str] = (), env: Mapping[str, str] | None = None, file: str | None = None
) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        run(argv, env, file)
    return caught.value.problems


WITH_FILE = {"CONFIG_FILE": "/etc/nvdp/config.yaml"}


def test_no_defaults_applied_by_argparse() -> None:
    args = vars(parser().parse_args([]))
    assert args and all(value is None for value in args.values())


def test_defaults_match_nvidia() -> None:
    options = run()
    assert options == PluginOptions(Config(flags=Flags(nvidia_dev_root="/")))
    assert options.config.flags.plugin.kubelet_socket == "/var/lib/kubelet/device-plugins/kubelet.sock"


# ---- precedence --------------------------------------------------------------------------------

# (flag argv, env, file text, attribute path, flag value, env value, file value, default)
FIELDS = [
    pytest.param(
        ["--mig-strategy=mixed"],
        {"MIG_STRATEGY": "single"},
        "flags: {migStrategy: none}",
        "flags.mig_strategy",
        "mixed",
        "single",
        "none",
        "none",
        id="mig-strategy",
    ),
    pytest.param(
        ["--fail-on-init-error=false"],
        {"FAIL_ON_INIT_ERROR": "true"},
        "flags: {failOnInitError: false}",
        "flags.fail_on_init_error",
        False,
        True,
        False,
        True,
        id="fail-on-init-error",
    ),
    pytest.param(
        ["--pass-device-specs"],
        {"PASS_DEVICE_SPECS": "false"},
        "flags: {plugin: {passDeviceSpecs: true}}",
        "flags.plugin.pass_device_specs",
        True,
        False,
        True,
        False,
        id="pass-device-specs",
    ),
    pytest.param(
        ["--device-list-strategy", "cdi-cri"],
        {"DEVICE_LIST_STRATEGY": "volume-mounts,envvar"},
        "flags: {plugin: {deviceListStrategy: cdi-annotations}}",
        "flags.plugin.device_list_strategy",
        ("cdi-cri",),
        ("volume-mounts", "envvar"),
        ("cdi-annotations",),
        ("envvar",),
        id="device-list",
    ),
    pytest.param(
        ["--device-id-strategy=index"],
        {"DEVICE_ID_STRATEGY": "uuid"},
        "flags: {plugin: {deviceIDStrategy: index}}",
        "flags.plugin.device_id_strategy",
        "index",
        "uuid",
        "index",
        "uuid",
        id="device-id",
    ),
    pytest.param(
        ["--nvidia-driver-root=/a"],
        {"NVIDIA_DRIVER_ROOT": "/b"},
        "flags: {nvidiaDriverRoot: /c}",
        "flags.nvidia_driver_root",
        "/a",
        "/b",
        "/c",
        "/",
        id="driver-root",
    ),
    pytest.param(
        ["--kubelet-socket=/a/kubelet.sock"],
        {"KUBELET_SOCKET": "/b/kubelet.sock"},
        "flags: {plugin: {kubeletSocket: /c/kubelet.sock}}",
        "flags.plugin.kubelet_socket",
        "/a/kubelet.sock",
        "/b/kubelet.sock",
        "/c/kubelet.sock",
        "/var/lib/kubelet/device-plugins/kubelet.sock",
        id="kubelet-socket",
    ),
    pytest.param(
        ["--mps-root=/a"],
        {"MPS_ROOT": "/b"},
        "flags: {mpsRoot: /c}",
        "flags.mps_root",
        "/a",
        "/b",
        "/c",
        None,
        id="mps-root",
    ),
    pytest.param(
        ["--imex-channel-ids="],
        {"IMEX_CHANNEL_IDS": ""},  # unset, as urfave/cli's IntSliceFlag reads it: the file's
        "imex: {channelIDs: [0]}",
        "imex.channel_ids",
        (),
        (0,),
        (0,),
        (),
        id="imex-channels",
    ),
    pytest.param(
        ["--shared-devices-allocation-policy=packed"],
        {"SHARED_DEVICES_ALLOCATION_POLICY": "distributed"},
        "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}",
        "flags.plugin.shared_devices_allocation_policy",
        "packed",
        "distributed",
        "packed",
        "distributed",
        id="shared-devices-allocation-policy",
    ),
]


def _get(config: object, path: str) -> object:
    value: object = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


@pytest.mark.parametrize("argv, env, file, path, from_flag, from_env, from_file, default", FIELDS)
def test_precedence(
    argv: list[str],
    env: dict[str, str],
    file: str,
    path: str,
    from_flag: object,
    from_env: object,
    from_file: object,
    default: object,
) -> None:
    assert _get(run(argv, {**WITH_FILE, **env}, file).config, path) == from_flag
    assert _get(run([], {**WITH_FILE, **env}, file).config, path) == from_env
    assert _get(run([], WITH_FILE, file).config, path) == from_file
    assert _get(run().config, path) == default


def test_config_file_path_from_flag_or_env(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("flags: {migStrategy: single}")
    b.write_text("flags: {migStrategy: mixed}")
    args = parser().parse_args([f"--config-file={a}"])
    assert resolve(args, {"CONFIG_FILE": str(b)}).config.flags.mig_strategy == "single"
    from_env = resolve(parser().parse_args([]), {"CONFIG_FILE": str(b)})
    assert (from_env.config.flags.mig_strategy, from_env.runtime.config_file) == ("mixed", str(b))
    assert resolve(parser().parse_args([]), {"CONFIG_FILE": ""}).runtime.config_file is None


@pytest.mark.parametrize(
    "argv, env",
    [
        pytest.param(
            ["--kubeconfig=/k", "--node-name=n1"], {"KUBECONFIG": "/e", "NODE_NAME": "e1"}, id="flags"
        ),
        pytest.param([], {"KUBECONFIG": "/k", "NODE_NAME": "n1"}, id="env"),
    ],
)
def test_the_plugin_takes_the_api_settings_of_the_side_commands(argv: list[str], env: dict[str, str]) -> None:
    runtime = run(argv, env).runtime
    assert (runtime.kubeconfig, runtime.node_name) == ("/k", "n1")
    assert (run().runtime.kubeconfig, run().runtime.node_name) == ("", "")


def test_file_settings_not_named_by_flags_are_kept() -> None:
    config = run(["--mig-strategy=mixed"], WITH_FILE, (DATA / "time-slicing.yaml").read_text()).config
    assert config.flags.mig_strategy == "mixed"
    assert config.sharing.strategy == "time-slicing"


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        pytest.param(["--nvidia-ctk-path=/x"], {}, "/x", id="flag-alias"),
        pytest.param(["--nvidia-cdi-hook-path=/x"], {"NVIDIA_CTK_PATH": "/y"}, "/x", id="flag-over-env"),
        pytest.param([], {"NVIDIA_CTK_PATH": "/y"}, "/y", id="second-env"),
        pytest.param([], {"NVIDIA_CDI_HOOK_PATH": "/z", "NVIDIA_CTK_PATH": "/y"}, "/z", id="first-env-wins"),
    ],
)
def test_aliases(argv: list[str], env: dict[str, str], expected: str) -> None:
    assert run(argv, env).config.flags.plugin.nvidia_ctk_path == expected


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        pytest.param(["--container-driver-root=/a"], {}, "/a", id="alias"),
        pytest.param([], {"CONTAINER_DRIVER_ROOT": "/b"}, "/b", id="alias-env"),
        pytest.param([], {"DRIVER_ROOT_CTR_PATH": "/c", "CONTAINER_DRIVER_ROOT": "/b"}, "/c", id="env-order"),
    ],
)
def test_container_driver_root_aliases(argv: list[str], env: dict[str, str], expected: str) -> None:
    assert run(argv, env).config.flags.plugin.container_driver_root == expected


@pytest.mark.parametrize(
    "argv, env, dev_root",
    [
        pytest.param([], {}, "/", id="default"),
        pytest.param(
            ["--driver-root=/run/nvidia/driver"], {}, "/run/nvidia/driver", id="follows-driver-root"
        ),
        pytest.param(["--driver-root=/run/nvidia/driver", "--dev-root=/"], {}, "/", id="explicit"),
        pytest.param([], {"NVIDIA_DRIVER_ROOT": "/d", "NVIDIA_DEV_ROOT": ""}, "/d", id="empty-follows"),
    ],
)
def test_dev_root_defaults_to_driver_root(argv: list[str], env: dict[str, str], dev_root: str) -> None:
    assert run(argv, env).config.flags.nvidia_dev_root == dev_root


# ---- value syntax ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        *[(t, True) for t in ("1", "t", "T", "TRUE", "true", "True")],
        *[(t, False) for t in ("0", "f", "F", "FALSE", "false", "False", "")],
    ],
    ids=repr,
)
def test_env_booleans_as_go_parse_bool(text: str, value: bool) -> None:
    assert run([], {"GDS_ENABLED": text}).config.flags.gds_enabled is value


@pytest.mark.parametrize("text", ["yes", "no", "on", "2", " true"], ids=repr)
def test_env_boolean_refused(text: str) -> None:
    assert errors([], {"GDS_ENABLED": text}) == [
        f'--gds-enabled / GDS_ENABLED: invalid value "{text}" (accepted: true, false, 1, 0)'
    ]


@pytest.mark.parametrize(
    "argv, value",
    [
        (["--mofed-enabled"], True),
        (["--mofed-enabled=false"], False),
        (["--mofed-enabled", "false"], False),
        (["--mofed-enabled=1"], True),
        ([], False),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else str(x),
)
def test_boolean_flags(argv: list[str], value: bool) -> None:
    assert run(argv).config.flags.mofed_enabled is value


@pytest.mark.parametrize(
    "argv, env, value",
    [
        pytest.param(["--device-list-strategy=envvar,cdi-cri"], {}, ("envvar", "cdi-cri"), id="comma"),
        pytest.param(
            ["--device-list-strategy=envvar", "--device-list-strategy=cdi-cri"],
            {},
            ("envvar", "cdi-cri"),
            id="repeated",
        ),
        pytest.param(
            [],
            {"DEVICE_LIST_STRATEGY": " envvar , volume-mounts "},
            ("envvar", "volume-mounts"),
            id="env-spaces",
        ),
        pytest.param(
            ["--device-list-strategy=cdi-cri"],
            {"DEVICE_LIST_STRATEGY": "envvar"},
            ("cdi-cri",),
            id="flag-replaces-env",
        ),
    ],
)
def test_list_flags(argv: list[str], env: dict[str, str], value: tuple[str, ...]) -> None:
    assert run(argv, env).config.flags.plugin.device_list_strategy == value


def test_ours_flags() -> None:
    config = run(
        ["--nvml=sim:dgx-a100", "--log-format=json", "--log-level=debug", "--metrics-address=127.0.0.1:9400"]
    ).runtime
    assert (config.nvml, config.log_format, config.log_level, config.metrics_address) == (
        "sim:dgx-a100",
        "json",
        "debug",
        "127.0.0.1:9400",
    )
    env = {
        "NVDP_NVML": "sim:/tmp/node.yaml",
        "LOG_FORMAT": "json",
        "LOG_LEVEL": "warning",
        "METRICS_ADDRESS": "",
    }
    config = run([], env).runtime
    assert (config.nvml, config.log_format, config.log_level, config.metrics_address) == (
        "sim:/tmp/node.yaml",
        "json",
        "warning",
        "",
    )


# ---- error messages ----------------------------------------------------------------------------

_ADDRESS = '(expected "[host]:port", or "" to disable)'
# Each case: id -> (argv, env, the one problem expected).
FLAG_ERRORS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "mig-flag": (
        ["--mig-strategy=foo"],
        {},
        '--mig-strategy / MIG_STRATEGY: invalid value "foo" (accepted: none, single, mixed)',
    ),
    "mig-flag-empty": (  # an empty env var is unset (tests/test_empty_env.py); an empty flag is a value
        ["--mig-strategy="],
        {},
        '--mig-strategy / MIG_STRATEGY: invalid value "" (accepted: none, single, mixed)',
    ),
    "device-id": (
        [],
        {"DEVICE_ID_STRATEGY": "name"},
        '--device-id-strategy / DEVICE_ID_STRATEGY: invalid value "name" (accepted: uuid, index)',
    ),
    "list": (
        ["--device-list-strategy=envvar,bogus"],
        {},
        '--device-list-strategy / DEVICE_LIST_STRATEGY: invalid value "bogus" '
        "(accepted: envvar, volume-mounts, cdi-annotations, cdi-cri)",
    ),
    "list-empty": (
        ["--device-list-strategy="],
        {},
        "--device-list-strategy / DEVICE_LIST_STRATEGY: must list at least 1 value",
    ),
    "discovery": (
        [],
        {"DEVICE_DISCOVERY_STRATEGY": "cdi"},
        '--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY: invalid value "cdi" '
        "(accepted: auto, nvml, tegra, vfio)",
    ),
    "imex": (
        [],
        {"IMEX_CHANNEL_IDS": "1"},
        "--imex-channel-ids / IMEX_CHANNEL_IDS: must be [] or [0], got [1]",
    ),
    "imex-int": (
        [],
        {"IMEX_CHANNEL_IDS": "x"},
        '--imex-channel-ids / IMEX_CHANNEL_IDS: must be an integer >= 0, got "x"',
    ),
    "bool-flag": (
        ["--fail-on-init-error=maybe"],
        {},
        '--fail-on-init-error / FAIL_ON_INIT_ERROR: invalid value "maybe" (accepted: true, false, 1, 0)',
    ),
    "nvml": (
        ["--nvml=sim:"],
        {},
        '--nvml / NVDP_NVML: invalid value "sim:" (accepted: real, sim:NAME, sim:/path/node.yaml)',
    ),
    "log-format": (
        ["--log-format=xml"],
        {},
        '--log-format / LOG_FORMAT: invalid value "xml" (accepted: text, json)',
    ),
    "log-level": (
        [],
        {"LOG_LEVEL": "trace"},
        '--log-level / LOG_LEVEL: invalid value "trace" (accepted: debug, info, warning, error)',
    ),
    "address": (
        ["--metrics-address=localhost"],
        {},
        f'--metrics-address / METRICS_ADDRESS: invalid address "localhost" {_ADDRESS}',
    ),
    "allocation-policy-flag": (
        ["--shared-devices-allocation-policy=spread"],
        {},
        "--shared-devices-allocation-policy / SHARED_DEVICES_ALLOCATION_POLICY: "
        'invalid value "spread" (accepted: distributed, packed)',
    ),
    "allocation-policy-env": (
        [],
        {"SHARED_DEVICES_ALLOCATION_POLICY": "Packed"},
        "--shared-devices-allocation-policy / SHARED_DEVICES_ALLOCATION_POLICY: "
        'invalid value "Packed" (accepted: distributed, packed)',
    ),
    "port": (
        ["--metrics-address=:99999"],
        {},
        f'--metrics-address / METRICS_ADDRESS: invalid address ":99999" {_ADDRESS}',
    ),
}


@pytest.mark.parametrize("argv, env, expected", list(FLAG_ERRORS.values()), ids=list(FLAG_ERRORS))
def test_flag_and_env_errors(argv: list[str], env: dict[str, str], expected: str) -> None:
    assert errors(argv, env) == [expected]


def test_every_problem_at_once_file_first() -> None:
    found = errors(
        ["--mig-strategy=foo"],
        {**WITH_FILE, "PASS_DEVICE_SPECS": "yes"},
        "flags: {plugin: {deviceIDStrategy: name}}\nhealth: {probeInterval: 0}",
    )
    assert found == [
        '/etc/nvdp/config.yaml: flags.plugin.deviceIDStrategy: invalid value "name" (accepted: uuid, index)',
        "/etc/nvdp/config.yaml: health.probeInterval: must be > 0, got 0",
        '--mig-strategy / MIG_STRATEGY: invalid value "foo" (accepted: none, single, mixed)',
        '--pass-device-specs / PASS_DEVICE_SPECS: invalid value "yes" (accepted: true, false, 1, 0)',
    ]


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        resolve(parser().parse_args([f"--config-file={path}"]), {})
    assert caught.value.problems == [f"{path}: cannot read config file: No such file or directory"]


MPS = "sharing: {mps: {resources: [{name: gpu, replicas: 4}]}}"


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        pytest.param(
            [],
            {},
            ["sharing.mps: MPS sharing needs an MPS root (--mps-root / MPS_ROOT / flags.mpsRoot)"],
            id="no-root",
        ),
        pytest.param(
            ["--mps-root=/run/nvidia/mps", "--mig-strategy=mixed"],
            {},
            [
                'sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
                "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)"
            ],
            id="mixed",
        ),
        pytest.param([], {"MPS_ROOT": "/run/nvidia/mps"}, [], id="ok"),
    ],
)
def test_mps_rules(argv: list[str], env: dict[str, str], expected: list[str]) -> None:
    if expected:
        assert errors(argv, {**WITH_FILE, **env}, MPS) == expected
    else:
        assert run(argv, {**WITH_FILE, **env}, MPS).config.sharing.strategy == "mps"


def test_resolved_json_line() -> None:
    config = run(["--nvml=sim:pcie-4"], WITH_FILE, (DATA / "plain.yaml").read_text())
    data = json.loads(config.to_json())
    assert data["flags"]["nvidiaDevRoot"] == "/"
    assert (data["configFile"], data["nvml"]) == ("/etc/nvdp/config.yaml", "sim:pcie-4")


def test_help_names_env_vars_and_defaults() -> None:
    text = parser().format_help()
    for option in PLUGIN_OPTIONS:
        assert option.names[0] in text
    assert '[env MIG_STRATEGY; default "none"]' in " ".join(text.split())
    assert "[env FAIL_ON_INIT_ERROR; default true]" in " ".join(text.split())


def test_every_option_targets_a_config_field() -> None:
    for option in PLUGIN_OPTIONS:
        _get(PluginOptions(), option.target)
