"""The MPS control daemon's real code against a stand-in `nvidia-cuda-mps-control` first on PATH
(tests/mps_standin.py): directories, env, the exact commands and limits, the ready marker, health
failure -> restart with backoff, reload by diff, teardown; and `nvdp mps-control-daemon` as a
process for SIGHUP / SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvdp.base.backoff import delay_after
from nvdp.base.logs import FIELDS_ATTR
from nvdp.config import parse_text
from nvdp.node.mps.command import node_plans
from nvdp.node.mps.controller import MpsController
from nvdp.node.mps.layout import MpsRoot
from nvdp.node.mps.plan import DaemonPlan
from nvdp.node.mps.status import read_status, write_status
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim.backend import SimNvml
from nvdp.node.nvml.types import ComputeMode
from testkit import Process, clean_env, wait_until
from tests.builders import sim_gpus
from tests.mps_standin import Standin

GPU = "nvidia.com/gpu"
MPS4 = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"
L40S_MIB = 46068  # pcie-4: 4 x L40S
LIMITS4 = [f"set_default_device_pinned_mem_limit {i} {L40S_MIB // 4}M" for i in range(4)] + [
    "set_default_active_thread_percentage 25"
]


def plans_for(text: str, nvml: SimNvml) -> dict[str, DaemonPlan]:
    return node_plans(parse_text(text), nvml)


@dataclass
class Running:
    controller: MpsController
    nvml: SimNvml
    root: MpsRoot
    standin: Standin
    thread: threading.Thread
    source: dict[str, str]

    def stop(self) -> None:
        self.controller.request_stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    standin = Standin(tmp_path / "standin")
    nvml = open_nvml("sim:pcie-4")
    assert isinstance(nvml, SimNvml)
    nvml.init()
    root = MpsRoot(tmp_path / "mps")
    source = {"config": MPS4}
    controller = MpsController(
        nvml,
        root,
        lambda: plans_for(source["config"], nvml),
        standin.env(),
        health_interval=0.1,
        backoff_base=0.1,
        backoff_cap=0.4,
    )
    thread = threading.Thread(target=controller.run, args=(plans_for(MPS4, nvml),), daemon=True)
    run = Running(controller, nvml, root, standin, thread, source)
    thread.start()
    wait_until(lambda: root.marker(GPU).exists(), timeout=10, what="ready marker")
    yield run
    if thread.is_alive():
        run.stop()
    nvml.shutdown()


def test_start_sets_compute_mode_dirs_env_limits_then_marker(running: Running) -> None:
    root, standin = running.root, running.standin
    pipe, logs = root.pipe_dir(GPU), root.log_dir(GPU)
    assert pipe == root.path / "nvidia.com" / "gpu" / "pipe" and pipe.is_dir() and logs.is_dir()
    assert root.shm_dir.is_dir()
    calls = standin.calls()
    assert calls[0]["argv"] == ["-d"]
    assert [c["stdin"] for c in calls[1:6]] == LIMITS4
    assert all(c["argv"] == [] for c in calls[1:]), "one invocation per command, command on stdin"
    assert {(c["pipe"], c["log"]) for c in calls} == {(str(pipe), str(logs))}
    assert {u: m for u, m in running.nvml.compute_modes.items()} == {
        g.uuid: ComputeMode.EXCLUSIVE_PROCESS for g in sim_gpus("pcie-4")
    }


def test_health_failure_removes_marker_and_restarts_with_capped_backoff(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    root, standin = running.root, running.standin
    wait_until(
        lambda: "get_default_active_thread_percentage" in standin.commands(), timeout=10, what="health query"
    )
    caplog.set_level(logging.INFO, logger="nvdp.node.mps.controller")
    standin.fail_start(3)
    starts_before = standin.commands().count("-d")
    standin.kill_daemon(root.pipe_dir(GPU))
    wait_until(lambda: not root.marker(GPU).exists(), timeout=10, what="marker removed while down")
    wait_until(lambda: root.marker(GPU).exists(), timeout=10, what="marker back after restart")
    assert standin.commands().count("-d") == starts_before + 4  # 3 failed starts, then one that works
    delays = [
        r.__dict__[FIELDS_ATTR]["retry_in"]
        for r in caplog.records
        if FIELDS_ATTR in r.__dict__ and "retry_in" in r.__dict__[FIELDS_ATTR]
    ]
    assert delays == [0.1, 0.2, 0.4, 0.4]  # health failure, then 3 failed starts; capped at 0.4
    times = [c["t"] for c in standin.calls() if c["argv"] == ["-d"]][starts_before:]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(gap >= want * 0.9 for gap, want in zip(gaps, delays[1:], strict=True)), gaps
    assert standin.commands()[-len(LIMITS4) :] == LIMITS4  # limits sent again before the marker


def test_missing_binary_is_said_in_the_status_file_and_the_gpus_stay_as_they_are(tmp_path: Path) -> None:
    """No `nvidia-cuda-mps-control` on PATH: the reason goes where the plugin reads it, the GPUs are not
    made EXCLUSIVE_PROCESS for a daemon that cannot run; once the binary is there, it starts."""
    nvml = open_nvml("sim:pcie-4")
    assert isinstance(nvml, SimNvml)
    nvml.init()
    root = MpsRoot(tmp_path / "mps")
    state = tmp_path / "standin"
    environ = {"PATH": str(state / "bin"), "MPS_STANDIN_DIR": str(state)}  # nothing there yet
    controller = MpsController(
        nvml,
        root,
        lambda: plans_for(MPS4, nvml),
        environ,
        health_interval=0.1,
        backoff_base=0.1,
        backoff_cap=0.2,
    )
    thread = threading.Thread(target=controller.run, args=(plans_for(MPS4, nvml),), daemon=True)
    thread.start()
    try:
        wait_until(lambda: read_status(root.status(GPU)) is not None, timeout=10, what="status file")
        assert read_status(root.status(GPU)) == "nvidia-cuda-mps-control not found"
        assert set(nvml.compute_modes.values()) <= {ComputeMode.DEFAULT} and not root.marker(GPU).exists()
        standin = Standin(state)  # the binary appears (a driver container finished installing)
        wait_until(lambda: root.marker(GPU).exists(), timeout=10, what="ready marker")
        wait_until(
            lambda: not root.status(GPU).exists(), timeout=10, what="status removed (after the marker)"
        )
        assert standin.commands()[0] == "-d"
        standin.fail_start(100)
        standin.kill_daemon(root.pipe_dir(GPU))
        failing = (
            "MPS daemon failed to start: nvidia-cuda-mps-control: start the MPS control daemon failed with "
            "exit status 1: stand-in: told to fail -d"
        )
        wait_until(lambda: read_status(root.status(GPU)) == failing, timeout=10, what="the start failure")
    finally:
        controller.request_stop()
        thread.join(10)
        nvml.shutdown()
    assert not root.status(GPU).exists()  # nothing to say once stopped


def test_status_file_is_one_bounded_printable_line(tmp_path: Path) -> None:
    path = tmp_path / ".status"
    write_status(path, "line one\x1b[31m\nline two " + "x" * 1000)
    assert read_status(path) == ("line one[31mline two " + "x" * 1000)[:297] + "..."
    path.write_bytes(b"\xff" * 10_000)
    assert read_status(path) == "\ufffd" * 297 + "..."
    path.unlink()
    os.mkfifo(path)
    assert read_status(path) is None  # not a regular file: not waited on
    assert read_status(tmp_path / "missing") is None


def test_restart_delay_is_exponential_and_capped() -> None:
    assert [delay_after(n, 1.0, 30.0) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]


def test_reload_by_diff_relimits_then_stops(running: Running) -> None:
    root, standin = running.root, running.standin
    running.source["config"] = MPS4.replace("replicas: 4", "replicas: 2")
    before = len(standin.commands())
    running.controller.request_reload()
    want = [f"set_default_device_pinned_mem_limit {i} {L40S_MIB // 2}M" for i in range(4)]
    want.append("set_default_active_thread_percentage 50")
    wait_until(lambda: want[-1] in standin.commands()[before:], timeout=10, what="new limits")
    new = [c for c in standin.commands()[before:] if not c.startswith("get_")]
    assert new == want, "re-limited in place: no quit, no new daemon"
    assert root.marker(GPU).exists()
    # a config without MPS stops the daemon and gives the GPUs back
    running.source["config"] = "version: v1\n"
    running.controller.request_reload()
    wait_until(lambda: "quit" in standin.commands(), timeout=10, what="quit")
    wait_until(lambda: not running.controller.daemons, timeout=10, what="daemon removed")
    assert not root.marker(GPU).exists()
    assert set(running.nvml.compute_modes.values()) == {ComputeMode.DEFAULT}


def test_reload_with_other_devices_restarts_the_daemon(running: Running) -> None:
    standin = running.standin
    running.source["config"] = MPS4.replace("replicas: 4", "replicas: 4\n      devices: [0, 1]")
    running.controller.request_reload()
    wait_until(lambda: standin.commands().count("-d") == 2, timeout=10, what="second -d")
    assert "quit" in standin.commands()
    gpus = sim_gpus("pcie-4")
    wait_until(lambda: running.root.marker(GPU).exists(), timeout=10, what="marker")
    modes = running.nvml.compute_modes
    assert [modes[g.uuid] for g in gpus] == [ComputeMode.EXCLUSIVE_PROCESS] * 2 + [ComputeMode.DEFAULT] * 2


def test_stop_quits_restores_default_compute_mode_and_removes_marker(running: Running) -> None:
    running.stop()
    assert running.standin.commands()[-1] == "quit"
    assert not running.standin.running(running.root.pipe_dir(GPU))
    assert not running.root.marker(GPU).exists()
    assert set(running.nvml.compute_modes.values()) == {ComputeMode.DEFAULT}


def test_daemon_log_is_followed(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nvdp.node.mps.controller")
    with (running.root.log_dir(GPU) / "control.log").open("a") as f:
        f.write("[2026-11-23] NEW CLIENT 4242\n")

    def followed() -> bool:
        return any(
            r.__dict__.get(FIELDS_ATTR, {}).get("line") == "[2026-11-23] NEW CLIENT 4242"
            for r in caplog.records
        )

    wait_until(followed, timeout=10, what="daemon log line in our log")


# ---- the command as a process: flags, SIGHUP, SIGTERM -------------------------------------------


def daemon_process(
    tmp_path: Path, standin: Standin, config: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Process:
    argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
    argv += [
        "--config-file",
        str(config),
        "--mps-root",
        str(tmp_path / "mps"),
        "--mps-health-interval",
        "100ms",
    ]
    return Process([*argv, *extra], tmp_path / "daemon.log", standin.env(clean_env(env)))


def test_command_sighup_relimits_and_sigterm_tears_down_exit_0(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    root = MpsRoot(tmp_path / "mps")
    process = daemon_process(tmp_path, standin, config)
    try:
        wait_until(lambda: root.marker(GPU).exists(), timeout=20, what="ready marker")
        assert standin.commands()[:6] == ["-d", *LIMITS4]
        config.write_text(MPS4.replace("replicas: 4", "replicas: 2"))
        process.send(signal.SIGHUP)
        wait_until(
            lambda: "set_default_active_thread_percentage 50" in standin.commands(),
            timeout=10,
            what="relimit",
        )
        process.send(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        process.stop()
    log = process.log()
    assert standin.commands()[-1] == "quit"
    assert not root.marker(GPU).exists()
    modes = [line.rpartition("mode=")[2] for line in log.splitlines() if "simulated compute mode set" in line]
    assert modes == ["EXCLUSIVE_PROCESS"] * 4 + ["DEFAULT"] * 4  # recorded by the simulated node
    assert "[stand-in] Starting control daemon" in log  # the daemon's log followed into ours
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("config", "argv", "line"),
    [
        pytest.param(
            MPS4.replace("replicas: 4", "replicas: 64"),
            [],
            "error: sharing.mps.resources[0].replicas: 64 is more than MPS supports (48 clients per GPU)",
            id="too-many-replicas",
        ),
        pytest.param(
            MPS4,
            ["--mig-strategy", "mixed"],
            'error: sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
            "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)",
            id="mixed",
        ),
        pytest.param(
            MPS4,
            ["--mps-health-interval", "0s"],
            'error: --mps-health-interval: must be > 0, got "0s"',
            id="interval",
        ),
    ],
)
def test_command_refuses_bad_config_with_one_line(
    tmp_path: Path, config: str, argv: list[str], line: str
) -> None:
    standin = Standin(tmp_path / "standin")
    path = tmp_path / "config.yaml"
    path.write_text(config)
    process = daemon_process(tmp_path, standin, path, *argv)
    assert process.wait(20) == 1
    assert process.log().strip().splitlines() == [line]
    assert standin.calls() == []


def test_nvidia_binary_name_is_a_console_script(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from nvdp.cli import mps_control_daemon_main
    from testkit import REPO

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mps-control-daemon"] == "nvdp.cli:mps_control_daemon_main"
    with pytest.raises(SystemExit) as done:
        mps_control_daemon_main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--config-file",
        "--mig-strategy",
        "--fail-on-init-error",
        "--nvidia-driver-root",
        "--mps-root",
    ):
        assert flag in out


def test_daemon_left_from_an_earlier_run_is_replaced(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    root = MpsRoot(tmp_path / "mps")
    root.pipe_dir(GPU).mkdir(parents=True)
    root.log_dir(GPU).mkdir(parents=True)
    (root.pipe_dir(GPU) / "control").touch()  # a daemon still running from before a container restart
    nvml = open_nvml("sim:pcie-4")
    nvml.init()
    controller = MpsController(nvml, root, lambda: plans_for(MPS4, nvml), standin.env(), health_interval=0.1)
    thread = threading.Thread(target=controller.run, args=(plans_for(MPS4, nvml),), daemon=True)
    thread.start()
    try:
        wait_until(lambda: root.marker(GPU).exists(), timeout=10, what="ready marker")
        assert standin.commands()[:4] == ["-d", "get_default_active_thread_percentage", "quit", "-d"]
        assert standin.commands()[4 : 4 + len(LIMITS4)] == LIMITS4
    finally:
        controller.request_stop()
        thread.join(10)
        nvml.shutdown()


def test_command_nvml_failure_exits_1_or_idles_without_fail_on_init_error(tmp_path: Path) -> None:
    standin = Standin(tmp_path / "standin")
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    argv = [
        sys.executable,
        "-m",
        "nvdp.cli",
        "mps-control-daemon",
        "--nvml",
        "real",
        "--config-file",
        str(config),
    ]
    argv += ["--mps-root", str(tmp_path / "mps"), "--nvidia-driver-root", str(tmp_path / "no-driver")]
    failing = Process(argv, tmp_path / "fail.log", standin.env(clean_env()))
    assert failing.wait(20) == 1
    assert (
        failing.log()
        .splitlines()[-1]
        .startswith("error: load libnvidia-ml.so.1 failed: NVML_ERROR_LIBRARY_NOT_FOUND")
    )
    idle = Process([*argv, "--fail-on-init-error=false"], tmp_path / "idle.log", standin.env(clean_env()))
    try:
        wait_until(lambda: "idling until SIGHUP" in idle.log(), timeout=20, what="idle line")
        idle.send(signal.SIGTERM)
        assert idle.wait(10) == 0
    finally:
        idle.stop()
    assert "Traceback" not in failing.log() + idle.log()
    assert standin.calls() == []
