"""Every flag of NVIDIA's gpu-feature-discovery v0.20.0 (cmd/gpu-feature-discovery/main.go, with
internal/flags' KubeClientConfig and NodeConfig groups), with its names, env vars and default, on
`nvdp gfd`: each name and each env var sets the setting, NVIDIA's env vars are read in NVIDIA's order,
and the default is NVIDIA's, or a difference docs/gfd.md lists with its reason. The behaviour of the
flags v0.20.0 added (`--sleep-interval infinite`, `--pod-name`, `--device-discovery-strategy vfio`,
the `--use-node-feature-api` default) is tested below, and in tests/test_gfd_owner.py."""

from __future__ import annotations

import math
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.cli import gfd_main
from nvdp.config import PluginOptions, resolve
from nvdp.side.gfd import run as gfd_run
from nvdp.side.gfd.options import GFD_OPTIONS, GfdSettings
from nvdp.side.gfd.output import FileOutput, NodeFeatureOutput
from testkit import REPO, Process, wait_until
from tests.kube_api_standin import KubeApiStandin
from tests.test_gfd_flags import parse
from tests.test_gfd_process import gfd_argv, gfd_env
from tests.test_gfd_run import RecordingOutput, _settings

CONFIG = str(REPO / "tests" / "data" / "gfd" / "configs" / "ts.yaml")


@dataclass(frozen=True)
class NvidiaFlag:
    names: tuple[str, ...]  # as NVIDIA spells them: the flag, then its aliases
    envs: tuple[str, ...]  # NVIDIA's, in its order
    default: object  # NVIDIA's default, as nvdp's settings hold it
    given: str  # a value to give
    expected: object  # what nvdp makes of it; a str starting "refused: " is the refusal's words
    read: Callable[[GfdSettings], object]


NVIDIA_GFD_FLAGS = [
    NvidiaFlag(
        ("--mig-strategy",), ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), "none", "mixed", "mixed",
        lambda s: s.config.flags.mig_strategy,
    ),
    NvidiaFlag(
        ("--fail-on-init-error",), ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"), True, "false", False,
        lambda s: s.config.flags.fail_on_init_error,
    ),
    NvidiaFlag(("--oneshot",), ("GFD_ONESHOT",), False, "true", True, lambda s: s.oneshot),
    NvidiaFlag(("--no-timestamp",), ("GFD_NO_TIMESTAMP",), False, "true", True, lambda s: s.no_timestamp),
    NvidiaFlag(
        ("--sleep-interval",), ("GFD_SLEEP_INTERVAL",), 60.0, "infinite", math.inf, lambda s: s.sleep_interval
    ),
    NvidiaFlag(
        ("--output-file", "--output", "-o"), ("GFD_OUTPUT_FILE",),
        "/etc/kubernetes/node-feature-discovery/features.d/gfd", "/x/gfd", "/x/gfd", lambda s: s.output_file,
    ),
    NvidiaFlag(
        ("--machine-type-file",), ("GFD_MACHINE_TYPE_FILE",), "/sys/class/dmi/id/product_name", "/x/dmi",
        "/x/dmi", lambda s: s.machine_type_file,
    ),
    NvidiaFlag(
        ("--config-file",), ("GFD_CONFIG_FILE", "CONFIG_FILE"), None, CONFIG, CONFIG,
        lambda s: s.runtime.config_file,
    ),
    NvidiaFlag(
        ("--use-node-feature-api",), ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"), True, "false",
        False, lambda s: s.use_node_feature_api,
    ),
    NvidiaFlag(
        ("--device-discovery-strategy",), ("DEVICE_DISCOVERY_STRATEGY",), "auto", "vfio", "vfio",
        lambda s: s.config.flags.device_discovery_strategy,
    ),
    NvidiaFlag(
        ("--driver-root-ctr-path", "--container-driver-root"),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"), "/driver-root", "/ctr", "/ctr",
        lambda s: s.config.flags.plugin.container_driver_root,
    ),
    NvidiaFlag(("--kubeconfig",), ("KUBECONFIG",), "", "/kc", "/kc", lambda s: s.kubeconfig),
    NvidiaFlag(("--kube-api-qps",), ("KUBE_API_QPS",), 5.0, "2.5", 2.5, lambda s: s.kube_api_qps),
    NvidiaFlag(("--kube-api-burst",), ("KUBE_API_BURST",), 10, "3", 3, lambda s: s.kube_api_burst),
    NvidiaFlag(("--namespace",), ("NAMESPACE",), "default", "ns1", "ns1", lambda s: s.namespace),
    NvidiaFlag(("--node-name",), ("NODE_NAME",), "", "node-a", "node-a", lambda s: s.node_name),
    NvidiaFlag(("--pod-name",), ("POD_NAME",), "", "gfd-abc", "gfd-abc", lambda s: s.pod_name),
]  # fmt: skip
# nvdp's defaults that are not NVIDIA's (docs/gfd.md, "Differences from NVIDIA's gfd"):
OTHER_DEFAULTS = {
    # true where the API server serves NodeFeature objects (nvdp.side.gfd.run.node_feature_api), else the file
    "--use-node-feature-api": None,
    # KUBERNETES_NAMESPACE, NAMESPACE, then POD_NAMESPACE, then the service account's namespace
    "--namespace": "",
}


def _id(flag: NvidiaFlag) -> str:
    return flag.names[0].lstrip("-")


def _parse_and_check(
    flag: NvidiaFlag, source: str, *argv: str, environ: dict[str, str] | None = None
) -> None:
    expected = flag.expected
    if isinstance(expected, str) and expected.startswith("refused: "):
        with pytest.raises(ConfigError) as raised:
            parse(*argv, environ=environ)
        (problem,) = raised.value.problems
        assert problem.startswith(flag.names[0]) and problem.endswith(expected.removeprefix("refused: "))
        assert source in problem or source in flag.names  # a flag's value is named by the flag
        return
    assert flag.read(parse(*argv, environ=environ)) == expected


@pytest.mark.parametrize("flag", NVIDIA_GFD_FLAGS, ids=_id)
def test_every_nvidia_gfd_flag_is_an_option_with_nvidias_env_vars_in_order(flag: NvidiaFlag) -> None:
    (option,) = [o for o in GFD_OPTIONS if o.names[0] == flag.names[0]]
    assert option.has_flag and set(flag.names) <= set(option.names)
    assert [env for env in option.envs if env in flag.envs] == list(flag.envs)


@pytest.mark.parametrize(
    ("flag", "name"),
    [(f, n) for f in NVIDIA_GFD_FLAGS for n in f.names],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_flag_name_sets_the_setting(flag: NvidiaFlag, name: str) -> None:
    _parse_and_check(flag, name, name, flag.given)


@pytest.mark.parametrize(
    ("flag", "env"),
    [(f, e) for f in NVIDIA_GFD_FLAGS for e in f.envs],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_env_var_sets_the_setting(flag: NvidiaFlag, env: str) -> None:
    _parse_and_check(flag, env, environ={env: flag.given})


@pytest.mark.parametrize("flag", NVIDIA_GFD_FLAGS, ids=_id)
def test_defaults_are_nvidias_but_the_listed_ones(flag: NvidiaFlag) -> None:
    default = flag.read(parse())
    assert default == OTHER_DEFAULTS.get(flag.names[0], flag.default)


@pytest.mark.parametrize("argv", [["--version"], ["-v"], ["--help"], ["-h"]])
def test_help_and_version_answer_as_urfave_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        gfd_main(argv)
    assert exited.value.code == 0 and capsys.readouterr().out


# ---- --sleep-interval infinite ---------------------------------------------------------------


def test_infinite_sleep_interval_from_the_config_file_and_its_dump(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  gfd:\n    sleepInterval: infinite\n")
    settings = parse("--config-file", str(config))
    assert settings.sleep_interval == math.inf
    assert settings.config.to_dict()["flags"]["gfd"]["sleepInterval"] == "infinite"
    config.write_text("version: v1\nflags:\n  gfd:\n    sleepInterval: forever\n")
    with pytest.raises(ConfigError) as raised:
        parse("--config-file", str(config))
    assert raised.value.problems == [f'{config}: flags.gfd.sleepInterval: invalid duration "forever"']


def test_infinite_sleep_interval_labels_once_and_sleeps_until_a_signal() -> None:
    recorder = RecordingOutput()
    settings = _settings(sleep_interval=math.inf)
    gfd = gfd_run.Gfd(settings, reload_settings=lambda: settings, output_factory=lambda s, stop: recorder)
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        wait_until(lambda: gfd.passes == 1, 20, "the one pass")
        assert not wait_for_more_passes(gfd, 1, 0.3)
        gfd.request_reload()  # SIGHUP: labels again, then sleeps again
        wait_until(lambda: gfd.passes == 2, 20, "the pass of the reload")
    finally:
        gfd.request_stop()
        thread.join(10)
    assert not thread.is_alive() and len(recorder.writes) == 2
    assert recorder.removed == 0, "an infinite interval keeps the labels at exit (NVIDIA's)"


@pytest.mark.parametrize(
    "interval, removed", [(3600.0, 1), (math.inf, 0)], ids=["interval-removes", "infinite-keeps"]
)
def test_an_abandoned_stop_keeps_the_labels_as_the_stop_would(interval: float, removed: int) -> None:
    recorder = RecordingOutput()
    settings = _settings(sleep_interval=interval)
    gfd = gfd_run.Gfd(settings, reload_settings=lambda: settings, output_factory=lambda s, stop: recorder)
    thread = threading.Thread(target=gfd.run)
    thread.start()
    try:
        wait_until(lambda: gfd.passes == 1, 20, "the first pass")
        gfd.abandon()  # what the signal handler calls when the stop does not finish in time
        assert recorder.removed == removed
    finally:
        gfd.request_stop()
        thread.join(10)


def wait_for_more_passes(gfd: gfd_run.Gfd, passes: int, seconds: float) -> bool:
    """Whether a pass after `passes` happens within `seconds` (a bounded negative check)."""
    try:
        wait_until(lambda: gfd.passes > passes, seconds, "another pass")
    except TimeoutError:
        return False
    return True


def test_an_unpublished_pass_is_retried_within_a_minute_even_with_an_infinite_interval() -> None:
    settings = _settings(sleep_interval=math.inf)
    gfd = gfd_run.Gfd(settings, reload_settings=lambda: settings)
    assert gfd._until_next_pass(settings) == math.inf
    gfd.publish_error = "cannot write labels to /x/gfd: No space left on device"
    assert gfd._until_next_pass(settings) == gfd_run.PUBLISH_RETRY_S == 60.0
    assert gfd._until_next_pass(replace(settings, sleep_interval=5.0)) == 5.0


# How the process ends, and whether its feature file outlives it. NVIDIA's gfd (v0.20.0, run()'s
# deferred clean-up) removes the file at exit except with --oneshot or an infinite sleep interval.
EXITS = {
    "interval-removes": (("--sleep-interval", "1h"), True, False),
    "infinite-keeps": (("--sleep-interval", "infinite"), True, True),
    "oneshot-keeps": (("--oneshot",), False, True),
}


@pytest.mark.parametrize("flags, stopped, kept", list(EXITS.values()), ids=list(EXITS))
def test_gfd_process_keeps_its_feature_file_at_exit_as_nvidia_does(
    tmp_path: Path, flags: tuple[str, ...], stopped: bool, kept: bool
) -> None:
    out = tmp_path / "gfd"
    argv = gfd_argv(*flags, "--output-file", str(out), nvml="sim:dgx-a100")
    with Process(argv, tmp_path / "gfd.log", gfd_env()) as process:
        wait_until(lambda: out.exists() or not process.alive(), 30, "the labels written")
        assert out.read_text().count("nvidia.com/gpu.count=8\n") == 1
        if stopped:
            assert process.alive()
            process.send(signal.SIGTERM)
        assert process.wait(20) == 0
    assert out.exists() is kept
    if kept:
        assert "nvidia.com/gpu.count=8\n" in out.read_text()
    assert not list(tmp_path.glob(".gfd-*")), "a temp file was left behind"


# ---- --device-discovery-strategy vfio ----------------------------------------------------------


def test_vfio_is_accepted_said_in_one_line_and_the_node_labelled(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    result = subprocess.run(
        gfd_argv("--oneshot", "-o", str(out), "--device-discovery-strategy", "vfio"),
        env=gfd_env(), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and warnings[0].endswith(gfd_run.VFIO_NOTICE)
    assert "nvidia.com/gpu.count=4\n" in out.read_text()


def test_vfio_without_nvml_never_exits_1(tmp_path: Path) -> None:
    """A passthrough node has no driver bound to its GPUs: NVML fails to start; with vfio that is no
    reason to exit (fail-on-init-error holds for the NVML strategies)."""
    out = tmp_path / "gfd"
    argv = [*gfd_argv("--oneshot", "-o", str(out), "--device-discovery-strategy", "vfio")]
    argv[argv.index("--nvml") + 1] = "real"
    env = gfd_env(LD_LIBRARY_PATH=str(tmp_path))  # no libnvidia-ml.so.1 anywhere
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [line.partition("=")[0] for line in out.read_text().splitlines()] == ["nvidia.com/gfd.timestamp"]
    without = subprocess.run(
        [a for a in argv if a not in ("--device-discovery-strategy", "vfio")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert without.returncode == 1 and "NVML init failed" in without.stderr


def test_the_plugin_still_refuses_vfio(tmp_path: Path) -> None:
    import argparse

    from nvdp.config import add_plugin_flags
    from nvdp.config.rules import VFIO_PLUGIN

    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    with pytest.raises(ConfigError) as raised:
        resolve(parser.parse_args(["--device-discovery-strategy", "vfio"]), {})
    assert raised.value.problems == [VFIO_PLUGIN]
    assert isinstance(resolve(parser.parse_args(["--device-discovery-strategy", "nvml"]), {}), PluginOptions)


# ---- --use-node-feature-api unset: NVIDIA's true where the Node Feature API is served --------


NFD_DISCOVERY = "/apis/nfd.k8s-sigs.io/v1alpha1"
SERVED = {"kind": "APIResourceList", "groupVersion": "nfd.k8s-sigs.io/v1alpha1", "resources": [
    {"name": "nodefeatures", "namespaced": True, "kind": "NodeFeature"},
]}  # fmt: skip


def test_unset_node_feature_api_uses_it_where_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    node = {"NODE_NAME": "node-a", "NAMESPACE": "gpu-ns"}
    with KubeApiStandin() as api:
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        api.put(NFD_DISCOVERY, SERVED)
        settings = parse(environ={**node, "KUBECONFIG": kubeconfig, "POD_NAME": "gfd-abc"})
        output = gfd_run.default_output(settings, lambda _: False, environ={})
        assert isinstance(output, NodeFeatureOutput) and output.pod_name == "gfd-abc"
        assert output.write({"nvidia.com/gpu.count": "4"}) is True
        assert api.objects[f"{NFD_DISCOVERY}/namespaces/gpu-ns/nodefeatures/nvidia-features-for-node-a"]
        api.delete(NFD_DISCOVERY)  # NFD's CRD not installed
        assert isinstance(gfd_run.default_output(settings, lambda _: False, environ={}), FileOutput)
    # nothing to ask: no node name / no API server
    assert isinstance(
        gfd_run.default_output(parse(environ={"KUBECONFIG": kubeconfig}), lambda _: False), FileOutput
    )
    assert isinstance(gfd_run.default_output(parse(environ=node), lambda _: False, environ={}), FileOutput)
    # the server gone
    gone = parse(environ={**node, "KUBECONFIG": kubeconfig})
    assert isinstance(gfd_run.default_output(gone, lambda _: False, environ={}), FileOutput)
    reasons = [
        r.__dict__["nvdp_fields"]["reason"]
        for r in caplog.records
        if r.getMessage().startswith("labels go to the feature")
    ]
    assert reasons[0] == "the API server serves no nfd.k8s-sigs.io/v1alpha1 NodeFeature objects"
    assert reasons[1] == "no node name (--node-name / NODE_NAME) or namespace"
    assert reasons[2] == "no API server: no kubeconfig and not in a cluster"
    assert reasons[3].startswith("the API server cannot be asked: ")
    # given either way, it is not asked
    for value, kind in (("true", NodeFeatureOutput), ("false", FileOutput)):
        given = parse(environ={**node, "KUBECONFIG": kubeconfig, "GFD_USE_NODE_FEATURE_API": value})
        assert isinstance(gfd_run.default_output(given, lambda _: False, environ={}), kind)
