"""config-manager's rules in process: flags and env vars, entry selection and fallbacks, the symlink
swap, process matching; config leniency (`--strict-config`); `nvdp config check`."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError, SelectionError
from nvdp.cli import main
from nvdp.config import add_plugin_flags, load_file, parse_text, resolve
from nvdp.side.configmanager import files, process
from nvdp.side.configmanager.manager import ConfigManager
from nvdp.side.configmanager.selection import list_entries, select
from nvdp.side.configmanager.settings import Settings, add_flags
from nvdp.side.configmanager.settings import resolve as resolve_settings
from testkit import REPO, clean_env, wait_until
from tests.fakes import FakeNodeEventClient

REQUIRED = ["--node-name", "n", "--config-file-srcdir", "/src", "--config-file-dst", "/dst/config"]


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return resolve_settings(parser.parse_args(argv), env or {})


# ---- flags and env ------------------------------------------------------------------------------


def test_defaults_are_nvidias() -> None:
    s = settings(REQUIRED)
    assert (s.node_label, s.send_signal, s.signal, s.process_to_signal, s.oneshot) == (
        "nvidia.com/device-plugin.config",
        True,
        1,
        "nvidia-device-plugin",
        False,
    )
    assert s.fallback_strategies == () and s.default_config == "" and s.kubeconfig is None


def test_env_vars_and_flag_precedence() -> None:
    env = {
        "NODE_NAME": "env-node",
        "CONFIG_FILE_SRCDIR": "/s",
        "CONFIG_FILE_DST": "/d",
        "ONESHOT": "true",
        "KUBECONFIG": "/k",
        "NODE_LABEL": "x/y",
        "DEFAULT_CONFIG": "a",
        "FALLBACK_STRATEGIES": "named,empty",
        "SEND_SIGNAL": "false",
        "SIGNAL": "10",
        "PROCESS_TO_SIGNAL": "p",
    }
    s = settings(["--node-name", "flag-node", "--fallback-strategies", "single"], env)
    assert s == Settings(
        node_name="flag-node",
        config_file_srcdir="/s",
        config_file_dst="/d",
        oneshot=True,
        kubeconfig="/k",
        node_label="x/y",
        default_config="a",
        fallback_strategies=("single",),
        send_signal=False,
        signal=10,
        process_to_signal="p",
    )


ERRORS = {
    "no-node": (
        [],
        {"CONFIG_FILE_SRCDIR": "/s", "CONFIG_FILE_DST": "/d"},
        "--node-name / NODE_NAME: must not be empty",
    ),
    "empty-label": (
        [*REQUIRED, "--node-label", ""],
        {},
        "--node-label / NODE_LABEL: must not be empty",
    ),
    "no-srcdir": (
        ["--node-name", "n", "--config-file-dst", "/d"],
        {},
        "--config-file-srcdir / CONFIG_FILE_SRCDIR: must not be empty",
    ),
    "no-dst": (
        ["--node-name", "n", "--config-file-srcdir", "/s"],
        {},
        "--config-file-dst / CONFIG_FILE_DST: must not be empty",
    ),
    "fallback": (
        REQUIRED,
        {"FALLBACK_STRATEGIES": "named,first"},
        'FALLBACK_STRATEGIES: invalid value "first" (accepted: named, single, empty)',
    ),
    "signal": (REQUIRED, {"SIGNAL": "HUP"}, 'SIGNAL: must be an integer from 1 to 64, got "HUP"'),
    "signal-range": ([*REQUIRED, "--signal", "99"], {}, "--signal: must be an integer from 1 to 64, got 99"),
    "send-signal": (
        REQUIRED,
        {"SEND_SIGNAL": "maybe"},
        'SEND_SIGNAL: invalid value "maybe" (accepted: true, false, 1, 0)',
    ),
    "oneshot": ([*REQUIRED, "--oneshot=2"], {}, '--oneshot: invalid value "2" (accepted: true, false, 1, 0)'),
}


@pytest.mark.parametrize("argv, env, expected", list(ERRORS.values()), ids=list(ERRORS))
def test_flag_and_env_errors(argv: list[str], env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(argv, env)
    assert caught.value.problems == [expected]


def test_a_bad_flag_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-manager", *REQUIRED, "--signal", "0"]) == 1
    assert capsys.readouterr().err == "error: --signal: must be an integer from 1 to 64, got 0\n"


# ---- selection ----------------------------------------------------------------------------------

SELECT = {
    "label": ("b", ["a", "b"], "", (), "b"),
    "default": (None, ["a", "b"], "a", (), "a"),
    "label-over-default": ("b", ["a", "b"], "a", ("empty",), "b"),
    "named": (None, ["a", "default"], "", ("named",), "default"),
    "single": (None, ["only"], "", ("single",), "only"),
    "empty": (None, ["a", "b"], "", ("empty",), ""),
    "in-order": (None, ["a", "b"], "", ("named", "single", "empty"), ""),
    "named-before-single": (None, ["default"], "", ("named", "single"), "default"),
}


@pytest.mark.parametrize(
    "label, entries, default, fallbacks, expected", list(SELECT.values()), ids=list(SELECT)
)
def test_select(
    label: str | None, entries: list[str], default: str, fallbacks: tuple[str, ...], expected: str
) -> None:
    assert select(label, entries, default, fallbacks) == expected


SELECT_ERRORS = {
    "unknown-label": ("c", ["a"], "", ("empty",), "no config entry named 'c' (entries: a)"),
    "missing-default": (None, ["a"], "z", (), "default config 'z' is not an entry (entries: a)"),
    "fallbacks-fail": (
        None,
        ["a", "b"],
        "",
        ("named", "single"),
        "no label value, no default config, and no fallback strategy applies (tried: named, single;"
        " entries: a, b)",
    ),
    "none": (
        None,
        [],
        "",
        (),
        "no label value, no default config, and no fallback strategy applies"
        " (tried: none configured; entries: none)",
    ),
}


@pytest.mark.parametrize(
    "label, entries, default, fallbacks, expected", list(SELECT_ERRORS.values()), ids=list(SELECT_ERRORS)
)
def test_select_errors(
    label: str | None, entries: list[str], default: str, fallbacks: tuple[str, ...], expected: str
) -> None:
    with pytest.raises(SelectionError) as caught:
        select(label, entries, default, fallbacks)
    assert str(caught.value) == expected


def test_entries_skip_dot_dot_names_and_directories(tmp_path: Path) -> None:
    stamp = tmp_path / "..2026_11_23"
    stamp.mkdir()
    (stamp / "a").write_text("")
    (tmp_path / "..data").symlink_to(stamp.name)
    (tmp_path / "a").symlink_to("..data/a")
    (tmp_path / "plain").write_text("")
    (tmp_path / "subdir").mkdir()
    assert list_entries(tmp_path) == ["a", "plain"]


# ---- the manager without a cluster --------------------------------------------------------------


def _manager(tmp_path: Path, **kw: object) -> tuple[ConfigManager, FakeNodeEventClient, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("version: v1\n")
    (src / "bad").write_text("flags: {migStrategy: sideways}\n")
    dst = tmp_path / "dst" / "config.yaml"
    events = FakeNodeEventClient()
    base = {
        "node_name": "n",
        "config_file_srcdir": str(src),
        "config_file_dst": str(dst),
        "send_signal": False,
    }
    return ConfigManager(Settings(**{**base, **kw}), events), events, dst  # type: ignore[arg-type]


def test_invalid_entry_is_never_linked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager, events, dst = _manager(tmp_path)
    manager.set_labels({"nvidia.com/device-plugin.config": "a"})
    assert manager.reconcile().changed and os.readlink(dst).endswith("/src/a")
    manager.set_labels({"nvidia.com/device-plugin.config": "bad"})
    for _ in range(3):
        outcome = manager.reconcile()
    assert not outcome.changed and outcome.entry == "a" and os.readlink(dst).endswith("/src/a")
    assert (
        outcome.problem == 'bad: flags.migStrategy: invalid value "sideways" (accepted: none, single, mixed)'
    )
    refused = [e for e in events.posted if e[1] == "DevicePluginConfigRefused"]
    assert len(refused) == 1 and refused[0][0] == "Warning"
    assert sum("config not applied" in r.getMessage() for r in caplog.records) == 1


def test_empty_fallback_links_dev_null(tmp_path: Path) -> None:
    manager, _, dst = _manager(tmp_path, fallback_strategies=("empty",))
    manager.set_labels({})
    assert manager.reconcile().entry == ""
    assert os.readlink(dst) == "/dev/null"


def test_link_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    dst = tmp_path / "config.yaml"
    files.link(str(dst), "/dev/null")
    files.link(str(dst), str(tmp_path / "x"))
    assert os.readlink(dst) == str(tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


# ---- finding the process ------------------------------------------------------------------------

MATCHES = {
    "exe": (
        "nvidia-device-plugin",
        ["/usr/bin/nvidia-device-plugin", "--x"],
        "/usr/bin/nvidia-device-plugin",
        True,
    ),
    "argv0": ("nvidia-device-plugin", ["nvidia-device-plugin"], None, True),
    "script": (
        "nvidia-device-plugin",
        ["/venv/bin/python3", "/venv/bin/nvidia-device-plugin"],
        "/usr/bin/python3.11",
        True,
    ),
    "script-path": (
        "/venv/bin/nvidia-device-plugin",
        ["/venv/bin/python3", "/venv/bin/nvidia-device-plugin"],
        None,
        True,
    ),
    "other-path": (
        "/other/nvidia-device-plugin",
        ["/venv/bin/python3", "/venv/bin/nvidia-device-plugin"],
        None,
        False,
    ),
    "nvidia-argv0": ("/usr/bin/mps-control-daemon", ["/usr/bin/mps-control-daemon"], "/other/exe", True),
    "nvdp-subcommand": (
        "nvidia-device-plugin",
        ["/usr/local/bin/python3", "/usr/local/bin/nvdp", "plugin", "--x"],
        "/usr/local/bin/python3.11",
        True,
    ),
    "nvdp-subcommand-path": (
        "/venv/bin/gpu-kubelet-plugin",
        ["/venv/bin/python3", "/venv/bin/nvdp", "dra-kubelet-plugin"],
        None,
        True,
    ),
    "nvdp-other-subcommand": (
        "nvidia-device-plugin",
        ["/venv/bin/python3", "/venv/bin/nvdp", "gfd"],
        None,
        False,
    ),
    "nvdp-subcommand-elsewhere": (
        "/other/nvidia-device-plugin",
        ["/venv/bin/python3", "/venv/bin/nvdp", "plugin"],
        None,
        False,
    ),
    "nvdp-no-subcommand": ("nvidia-device-plugin", ["/venv/bin/python3", "/venv/bin/nvdp"], None, False),
    "nvdp-as-argument": ("nvidia-device-plugin", ["/bin/grep", "nvdp", "plugin"], "/bin/grep", False),
    "argument-only": ("nvidia-device-plugin", ["/bin/grep", "nvidia-device-plugin"], "/bin/grep", False),
    "other": ("nvidia-device-plugin", ["/bin/sleep", "1"], "/bin/sleep", False),
    "prefix": ("nvidia-device-plugin", ["nvidia-device-plugin-x"], None, False),
}


@pytest.mark.parametrize("name, argv, exe, expected", list(MATCHES.values()), ids=list(MATCHES))
def test_process_matching(name: str, argv: list[str], exe: str | None, expected: bool) -> None:
    assert process.matches(name, argv, exe) is expected


def test_find_in_proc_sees_a_python_script(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-device-plugin"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    script.chmod(0o755)
    child = subprocess.Popen([str(script)])
    try:  # until the exec is done, the child still shows pytest's command line
        assert wait_until(lambda: process.find(str(script)), 10, "the script in /proc") == [child.pid]
        assert process.find("nvidia-device-plugin-not-this") == []
    finally:
        child.kill()
        child.wait()


# ---- config leniency ----------------------------------------------------------------------------

NEWER = "version: v1\nflags:\n  migStrategey: none\n  plugin:\n    gpuSharingOrder: spread\n"


def test_unknown_keys_warn_once_each_and_load(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parse_text(NEWER, source="c.yaml")
    assert [r.getMessage() for r in caplog.records] == [
        "c.yaml: flags.migStrategey: unknown field (did you mean migStrategy?);"
        " ignored (--strict-config refuses it)",
        "c.yaml: flags.plugin.gpuSharingOrder: unknown field (accepted: passDeviceSpecs, "
        "deviceListStrategy, deviceIDStrategy, cdiAnnotationPrefix, nvidiaCTKPath, containerDriverRoot, "
        "kubeletSocket, cdiFeatureFlags, sharedDevicesAllocationPolicy);"
        " ignored (--strict-config refuses it)",
    ]


def test_wrong_types_stay_errors_when_lenient() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_text("flags: {migStrategy: 3, extra: 1}")
    assert caught.value.problems == ["flags.migStrategy: must be a string, got 3"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_strict_config_refuses_unknown_keys(tmp_path: Path, how: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(NEWER)
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    argv = ["--config-file", str(path)] + (["--strict-config"] if how == "flag" else [])
    env = {"STRICT_CONFIG": "true"} if how == "env" else {}
    with pytest.raises(ConfigError) as caught:
        resolve(parser.parse_args(argv), env)
    assert (
        caught.value.problems[0] == f"{path}: flags.migStrategey: unknown field (did you mean migStrategy?)"
    )
    assert resolve(parser.parse_args(["--config-file", str(path)]), {}).runtime.config_file == str(path)


def test_plugin_runs_with_unknown_keys(tmp_path: Path) -> None:
    """The plugin process itself: one WARNING line per unknown key, then it serves (--help would not
    load the file; use the simulate command's one-shot demo, which resolves the same way)."""
    path = tmp_path / "c.yaml"
    path.write_text(NEWER)
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "simulate", "--profile", "pcie-4", "--config-file", str(path)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "unknown field" in line]
    assert len(warnings) == 2 and "did you mean migStrategy?" in warnings[0]
    assert load_file(path).flags.mig_strategy == "none"


# ---- nvdp config check --------------------------------------------------------------------------


def test_config_check_directory_and_resources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").write_text(
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 3}]}}\n"
    )
    (tmp_path / "plain").write_text("version: v1\n")
    assert main(["config", "check", str(tmp_path), "--nvml", "sim:pcie-4"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}/a: ok, 1 resource(s) (migStrategy none)",
        "  nvidia.com/gpu: 12 device(s) time-slicing x3",
        f"{tmp_path}/plain: ok, 1 resource(s) (migStrategy none)",
        "  nvidia.com/gpu: 4 device(s)",
    ]


def test_config_check_shows_the_gpus_the_dra_driver_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dra").write_text("version: v1\ndra:\n  devices: [2, 3, 9]\n")
    assert main(["config", "check", str(tmp_path / "dra"), "--nvml", "sim:pcie-4"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}/dra: ok, 1 resource(s) (migStrategy none)",
        "  nvidia.com/gpu: 2 device(s)",
        "  DRA (2 GPU(s), not the device plugin's): GPU 2, 3",
        "  warning: dra.devices: no GPU 9 on this node; left out",
    ]


def test_config_check_is_strict_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("version: v1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("flags: {migStrategey: none}\n")
    assert main(["config", "check", str(good), str(bad), str(tmp_path / "missing.yaml")]) == 1
    out = capsys.readouterr()
    assert out.out == f"{good}: ok\n"
    assert out.err.splitlines() == [
        f"error: {bad}: flags.migStrategey: unknown field (did you mean migStrategy?)",
        f"error: {tmp_path}/missing.yaml: cannot read config file: No such file or directory",
    ]


def test_config_check_mig_strategy_on_a_mig_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n")
    assert main(["config", "check", str(path), "--nvml", "sim:dgx-a100-mig", "--mig-strategy", "mixed"]) == 0
    out = capsys.readouterr().out
    assert "(migStrategy mixed)" in out and "nvidia.com/mig-" in out


# ---- the Node watch and the status endpoints (in process, against the API stand-in) -------------


def test_watch_keeps_retrying_raises_the_alarm_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import threading
    import urllib.error
    import urllib.request

    from nvdp import kube
    from nvdp.kube.reflector import WatchTimers
    from nvdp.side.configmanager import object_watch
    from nvdp.side.configmanager.status import Snapshot, StatusServer, failing_for
    from tests.kube_api_standin import KubeApiStandin

    with KubeApiStandin() as api:
        api.put(
            "/api/v1/nodes/n", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {}}}
        )
        api.fail(500, 1000, path_prefix="/api/v1/nodes")
        seen: list[dict[str, str] | None] = []
        failures: list[str] = []
        watch = object_watch.NodeWatch(
            kube.new_api_client(kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig"))),
            "n",
            lambda node: seen.append(None if node is None else node.labels),
            on_failure=lambda message, _: failures.append(message),
            timers=WatchTimers(backoff_initial_s=0.01, backoff_max_s=0.05, alarm_after_s=0.3),
        )
        server = StatusServer(
            "127.0.0.1:0",
            lambda: Snapshot(bool(seen), 0, 0, 0, failing_for(watch.failing_since)),
            alarm_after=0.3,
        ).start()
        stop = threading.Event()
        thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
        with caplog.at_level(logging.WARNING, logger="nvdp.side.configmanager.object_watch"):
            thread.start()
            api.wait_for(lambda: any(r.levelno == logging.ERROR for r in caplog.records), 10, "alarm line")
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
            assert caught.value.code == 503
            alarms = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(alarms) == 1 and alarms[0].startswith("node watch has been failing node=n for=")
            assert failures[0] == "HTTP 500 injected failure 500" and thread.is_alive()
            api.clear_failures()  # the API server answers again
            api.wait_for(lambda: seen == [{}], 10, "list after recovery")
            assert watch.failing_since is None
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5) as ok:
                assert ok.status == 200
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as metrics:
                assert b"nvdp_config_manager_watch_healthy 1" in metrics.read()
        api.stop_watch(stop, thread)
        server.stop()
        assert not thread.is_alive()


def test_strict_config_refuses_entries_with_unknown_keys(tmp_path: Path) -> None:
    manager, events, dst = _manager(tmp_path, strict_config=True)
    (tmp_path / "src" / "newer").write_text(NEWER)
    manager.set_labels({"nvidia.com/device-plugin.config": "newer"})
    outcome = manager.reconcile()
    assert outcome.entry is None and not dst.exists()
    assert outcome.problem == "newer: flags.migStrategey: unknown field (did you mean migStrategy?); " + (
        "newer: flags.plugin.gpuSharingOrder: unknown field (accepted: passDeviceSpecs, "
        "deviceListStrategy, deviceIDStrategy, cdiAnnotationPrefix, nvidiaCTKPath, containerDriverRoot, "
        "kubeletSocket, cdiFeatureFlags, sharedDevicesAllocationPolicy); without the label: no label"
        " value, no default config, and no fallback strategy applies (tried: none configured; entries: a,"
        " bad, newer)"
    )
    (tmp_path / "lenient").mkdir()
    lenient, _, dst2 = _manager(tmp_path / "lenient")
    (tmp_path / "lenient" / "src" / "newer").write_text(NEWER)
    lenient.set_labels({"nvidia.com/device-plugin.config": "newer"})
    assert lenient.reconcile().entry == "newer" and os.readlink(dst2).endswith("/newer")
