"""An env var set to the empty string is unset, for every env var of every command, as NVIDIA's
urfave/cli reads numbers (its chart runs the config-manager init container with `SIGNAL=""`). The
exceptions are where the empty string is a value of its own: a boolean's is false (urfave/cli's
BoolFlag), an empty KUBELET_SOCKET serves without registering (NVIDIA's plugin), an empty
METRICS_ADDRESS turns the endpoint off (nvdp's). The cases come from the commands' option tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import PluginOptions
from nvdp.config import resolve as resolve_plugin
from nvdp.config.options import Option, read_options, with_values
from nvdp.kube.client import in_cluster
from nvdp.node.health.node_events import node_events_from_env
from nvdp.node.health.xid import XidPolicy
from nvdp.node.mps.command import resolve as resolve_mps
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim.backend import SimNvml
from nvdp.plugins.dra.options import resolve_dra
from nvdp.plugins.ledger.status import StatusFlags
from nvdp.plugins.uninstall import resolve_delete_daemonsets
from nvdp.side.configmanager.settings import resolve as resolve_manager
from nvdp.side.gfd.options import resolve_gfd
from testkit import Process, clean_env, wait_until
from tests.kube_api_standin import KubeApiStandin
from tests.test_command_options import COMMANDS, NO_ENV, parsers
from tests.test_config_manager import ConfigMapDir, console_script
from tests.test_simulate import run_simulate

NO_FILE = "/nonexistent/namespace"  # no service account: nothing read from the host
Resolve = Callable[[argparse.Namespace, dict[str, str]], object]


def _status_flags(args: argparse.Namespace, environ: dict[str, str]) -> object:
    given, problems = read_options(COMMANDS["status"][0], args, environ)
    if problems:
        raise ConfigError(problems)
    return with_values(StatusFlags(), given)


# command -> (the flags it needs to resolve at all, its resolver)
RESOLVERS: dict[str, tuple[list[str], Resolve]] = {
    "plugin": ([], resolve_plugin),
    "simulate": ([], resolve_plugin),
    "gfd": ([], lambda args, env: resolve_gfd(args, env, token_dir=NO_FILE)),
    "mps-control-daemon": ([], resolve_mps),
    "status": ([], _status_flags),
    "dra-kubelet-plugin": (["--node-name", "node-a"], resolve_dra),
    "config-manager": (
        ["--node-name", "node-a", "--config-file-srcdir", "/src", "--config-file-dst", "/dst/config.yaml"],
        lambda args, env: resolve_manager(args, env, namespace_file=NO_FILE),
    ),
    "delete-daemonsets": (
        ["nvdp", "--namespace", "gpu-system"],
        lambda args, env: resolve_delete_daemonsets(args, env, namespace_file=NO_FILE),
    ),
}


def _cases(reads_empty: bool) -> Iterator[object]:
    for command, (options, _) in COMMANDS.items():
        if command in NO_ENV:
            continue
        for option in options:
            if option.reads_empty_env == reads_empty:
                for env in option.envs:
                    yield pytest.param(command, option, env, id=f"{command}-{env}")


def resolved(command: str, environ: dict[str, str]) -> object:
    argv, resolve = RESOLVERS[command]
    return resolve(parsers()[command].parse_args(argv), environ)


def test_every_command_with_env_vars_is_resolved() -> None:
    assert set(RESOLVERS) == set(COMMANDS) - NO_ENV


@pytest.mark.parametrize(("command", "option", "env"), list(_cases(reads_empty=False)))
def test_an_empty_env_var_is_unset(command: str, option: Option, env: str) -> None:
    assert resolved(command, {env: ""}) == resolved(command, {})


@pytest.mark.parametrize(("command", "option", "env"), list(_cases(reads_empty=True)))
def test_an_empty_env_var_with_a_meaning_is_that_value(command: str, option: Option, env: str) -> None:
    expected = option.parse("")
    assert expected is False or option.empty == "value"  # a boolean's "" is false, as urfave/cli's
    assert read_options([option], argparse.Namespace(), {env: ""}) == ({option.field: expected}, [])
    resolved(command, {env: ""})  # no problem: the command starts


def test_the_env_vars_whose_empty_value_means_something() -> None:
    """The declared exceptions: NVIDIA's serve-without-registering and nvdp's endpoint off."""
    declared = {e for options, _ in COMMANDS.values() for o in options if o.empty == "value" for e in o.envs}
    assert declared == {"KUBELET_SOCKET", "METRICS_ADDRESS"}


def test_an_empty_env_var_leaves_the_config_files_value(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {migStrategy: mixed, plugin: {deviceIDStrategy: index}}\n")
    env = {"CONFIG_FILE": str(path), "MIG_STRATEGY": "", "DEVICE_ID_STRATEGY": "", "GFD_MIG_STRATEGY": ""}
    for command in ("plugin", "gfd", "mps-control-daemon"):
        settings = resolved(command, env)
        assert isinstance(settings, PluginOptions)
        assert settings.config.flags.mig_strategy == "mixed", command
        assert settings.config.flags.plugin.device_id_strategy == "index", command


def _mig_strategy(settings: PluginOptions) -> object:
    return settings.config.flags.mig_strategy


def _config_file(settings: PluginOptions) -> object:
    return settings.runtime.config_file


def _ctk_path(settings: PluginOptions) -> object:
    return settings.config.flags.plugin.nvidia_ctk_path


@pytest.mark.parametrize(
    ("command", "environ", "read", "expected"),
    [
        ("gfd", {"GFD_MIG_STRATEGY": "", "MIG_STRATEGY": "mixed"}, _mig_strategy, "mixed"),
        ("gfd", {"GFD_CONFIG_FILE": "", "CONFIG_FILE": ""}, _config_file, None),
        ("plugin", {"NVIDIA_CDI_HOOK_PATH": "", "NVIDIA_CTK_PATH": "/opt/ctk"}, _ctk_path, "/opt/ctk"),
    ],
    ids=["gfd-mig-strategy", "gfd-config-file", "plugin-cdi-hook-path"],
)
def test_an_empty_env_var_lets_the_next_one_count(
    command: str, environ: dict[str, str], read: Callable[[PluginOptions], object], expected: object
) -> None:
    settings = resolved(command, environ)
    assert isinstance(settings, PluginOptions) and read(settings) == expected


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"SIGNAL": "x"}, 'SIGNAL: must be an integer from 1 to 64, got "x"'),
        ({"NVDP_CONFIG_POLL_INTERVAL": " "}, "NVDP_CONFIG_POLL_INTERVAL: invalid duration"),
    ],
    ids=["signal", "blank-is-not-empty"],
)
def test_a_bad_nonempty_value_is_still_refused(environ: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        resolved("config-manager", environ)
    assert len(raised.value.problems) == 1 and raised.value.problems[0].startswith(problem)


# ---- NVIDIA's chart: the config-manager init container --------------------------------------------

NODE = "node-a"
LABEL = "nvidia.com/device-plugin.config"
TIME_SLICED = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"


@pytest.mark.parametrize("label", ["ts", None], ids=["labelled", "fallback-named"])
def test_nvidia_init_container_env_links_the_config_and_exits_0(
    tmp_path: Path, processes: list[Process], label: str | None
) -> None:
    """The env of NVIDIA's chart (v0.20.0, daemonset-device-plugin.yml, nvidia-device-plugin-init),
    KUBECONFIG aside (the chart's "" means in-cluster; here: the API stand-in's), run through the
    `config-manager` console script."""
    with KubeApiStandin() as api:
        labels = {LABEL: label} if label else {}
        api.put(
            f"/api/v1/nodes/{NODE}",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}},
        )
        src = ConfigMapDir(tmp_path / "available-configs", {"ts": TIME_SLICED, "default": "version: v1\n"})
        dst = tmp_path / "config" / "config.yaml"
        dst.parent.mkdir()
        env = {
            "ONESHOT": "true",
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "NODE_NAME": NODE,
            "NODE_LABEL": LABEL,
            "CONFIG_FILE_SRCDIR": str(src.root),
            "CONFIG_FILE_DST": str(dst),
            "DEFAULT_CONFIG": "",  # the chart's config.default
            "FALLBACK_STRATEGIES": "named,single",
            "SEND_SIGNAL": "false",
            "SIGNAL": "",
            "PROCESS_TO_SIGNAL": "",
        }
        exe = console_script(tmp_path / "bin", "config-manager", "config_manager_main")
        init = Process([str(exe)], tmp_path / "init.log", clean_env(env))
        processes.append(init)
        code = wait_until(lambda: init.popen.poll() is not None and (init.popen.returncode,), 30, "exit")
        assert code == (0,), init.log()
        assert dst.is_symlink() and dst.resolve() == (src.root / (label or "default")).resolve()
        assert "error" not in init.log().lower()


def test_simulate_takes_empty_env_vars_as_unset() -> None:
    """`nvdp simulate` picks its own defaults (a simulated node, MPS and CDI directories of its own)
    where NVDP_NVML, MPS_ROOT and CDI_SPEC_DIR are empty, as where they are not set."""
    result = run_simulate(env={"NVDP_NVML": "", "MPS_ROOT": "", "CDI_SPEC_DIR": ""})
    assert result.returncode == 0, result.stderr
    assert "node sim:dgx-a100" in result.stdout


# ---- the env vars read outside the option tables -------------------------------------------------


def test_nvdp_sim_events_empty_is_no_events_file() -> None:
    nvml = open_nvml("sim:dgx-a100", environ={"NVDP_SIM_EVENTS": ""})
    assert isinstance(nvml, SimNvml) and nvml.events_path is None


def test_health_check_env_vars_empty_are_unset() -> None:
    empty = {"DP_DISABLE_HEALTHCHECKS": "", "DP_ENABLE_HEALTHCHECKS": ""}
    assert XidPolicy.from_env(empty) == XidPolicy.from_env({})


def test_node_name_and_service_host_empty_are_unset(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    assert node_events_from_env({"NODE_NAME": ""}, token_file=str(token)) is None
    assert not in_cluster({"KUBERNETES_SERVICE_HOST": ""}, str(token))


def test_gfd_pod_namespace_empty_is_unset(tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("gpu-operator\n")
    args = parsers()["gfd"].parse_args([])
    assert resolve_gfd(args, {"POD_NAMESPACE": ""}, token_dir=str(tmp_path / "namespace")).namespace == (
        "gpu-operator"
    )
