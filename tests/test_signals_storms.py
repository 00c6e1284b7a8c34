"""Thousands of SIGHUPs at sub-millisecond spacing to each long-running command as a real process:
plugin, gfd, config-manager and mps-control-daemon stay alive and keep doing their job, the signals
coalesce into a few reloads, and SIGTERM then stops each within a few seconds, exit 0, with its
sockets, lock, labels or markers cleaned up.

Before nvdp.base.signals the handlers logged and took locks in the signal handler: storms like these
crashed commands (RecursionError through nested handlers) or wedged them (SIGTERM ignored)."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

import pytest

from nvdp.base.signals import RELOAD_INTERVAL_S
from nvdp.node.mps.layout import MpsRoot
from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, free_port, start_plugin, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.mps_standin import Standin
from tests.signal_storm import storm
from tests.test_config_manager import LABEL, NODE_PATH, ConfigMapDir, manager_argv, ts
from tests.test_gfd_process import PLAIN_CONFIG, gfd_argv, gfd_env
from tests.test_mps_daemon import MPS4, daemon_process

GPU = "nvidia.com/gpu"
STOP_WITHIN_S = 3.0
api = test_config_manager.api  # the Kubernetes API stand-in serving the Node (fixture, by name)


def count(process: Process, text: str) -> int:
    return process.log().count(text)


def stop_clean(process: Process) -> float:
    """SIGTERM; asserts exit 0 within STOP_WITHIN_S; returns how long it took."""
    began = time.monotonic()
    process.send(signal.SIGTERM)
    assert process.wait(STOP_WITHIN_S + 7) == 0, process.log()[-3000:]
    took = time.monotonic() - began
    assert took < STOP_WITHIN_S, f"stopped after {took:.1f}s"
    log = process.log()
    assert log.count("signal received; stopping signal=SIGTERM") == 1
    assert "Traceback" not in log and "RecursionError" not in log
    return took


def timed_storm(process: Process) -> tuple[int, float]:
    """A storm (tests/signal_storm.py): how many SIGHUPs were sent, over how many seconds."""
    began = time.monotonic()
    sent = storm(process)
    return sent, time.monotonic() - began


def assert_coalesced(process: Process, sent: int, took: float, done: str | None) -> None:
    """The storm became a few reload requests, at most one per RELOAD_INTERVAL_S (each logged once),
    and each one was done (the `done` line)."""
    requested = count(process, "SIGHUP received; reloading")
    assert 1 <= requested <= took / RELOAD_INTERVAL_S + 2, (requested, sent, took)
    if done is not None:
        wait_until(lambda: count(process, done) >= requested, 10, "the requested reloads done")


@pytest.mark.soak
def test_plugin_keeps_serving_through_a_sighup_storm(kubelet: Kubelet, processes: list[Process]) -> None:
    port = free_port()
    plugin = start_plugin(kubelet.plugin_dir, metrics_address=f"127.0.0.1:{port}")
    processes.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=30)
    devices = sorted(kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=15))
    sent, took = timed_storm(plugin)
    assert plugin.alive(), plugin.log()[-3000:]
    assert sent >= 1000
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        assert response.status == 200
    assert not kubelet.stream_closed(GPU)  # the kubelet's stream never ended: still registered
    answer = kubelet.allocate(GPU, [[devices[0]]]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == devices[0]
    assert_coalesced(plugin, sent, took, "reloaded resources=")
    stop_clean(plugin)
    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == ["kubelet.sock", "plugin.log"]


@pytest.mark.soak
def test_gfd_keeps_labelling_through_a_sighup_storm(tmp_path: Path, processes: list[Process]) -> None:
    out, config = tmp_path / "gfd", tmp_path / "config.yaml"
    config.write_text(PLAIN_CONFIG)
    argv = gfd_argv("--output-file", str(out), "--config-file", str(config), "--sleep-interval", "1h")
    gfd = Process(argv, tmp_path / "gfd.log", gfd_env())
    processes.append(gfd)
    wait_until(lambda: out.exists(), 30, "first label file")
    sent, took = timed_storm(gfd)
    assert gfd.alive(), gfd.log()[-3000:]
    assert_coalesced(gfd, sent, took, "configuration reloaded")
    # still labelling: a new config and one SIGHUP relabel the node
    config.write_text(
        PLAIN_CONFIG + "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
    )
    gfd.send(signal.SIGHUP)
    wait_until(lambda: "nvidia.com/gpu.replicas=4\n" in out.read_text(), 15, "labels after the storm")
    stop_clean(gfd)
    assert not out.exists(), "the labels outlived the process"


@pytest.mark.soak
def test_config_manager_keeps_watching_through_a_sighup_storm(
    tmp_path: Path, api: KubeApiStandin, processes: list[Process]
) -> None:
    src = ConfigMapDir(tmp_path / "src", {"a": ts(2), "b": ts(4)})
    dst = tmp_path / "dst" / "config.yaml"
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    argv = manager_argv(kubeconfig, src.root, dst, tmp_path / "nobody", "--default-config", "a")
    manager = Process([*argv, "--send-signal", "false"], tmp_path / "manager.log", clean_env())
    processes.append(manager)
    wait_until(lambda: "config applied" in manager.log(), 30, "first pass")
    sent, took = timed_storm(manager)
    assert manager.alive(), manager.log()[-3000:]
    assert_coalesced(manager, sent, took, None)  # a pass logs nothing when nothing changed
    api.patch_labels(NODE_PATH, {LABEL: "b"})  # still watching the Node: the label is applied
    wait_until(lambda: dst.resolve().name == "b", 15, "label b applied after the storm")
    stop_clean(manager)


@pytest.mark.soak
def test_mps_control_daemon_keeps_its_daemon_through_a_sighup_storm(
    tmp_path: Path, processes: list[Process]
) -> None:
    standin = Standin(tmp_path / "standin")
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    root = MpsRoot(tmp_path / "mps")
    daemon = daemon_process(tmp_path, standin, config)
    processes.append(daemon)
    wait_until(lambda: root.marker(GPU).exists(), 20, "ready marker")
    sent, took = timed_storm(daemon)
    assert daemon.alive(), daemon.log()[-3000:]
    assert_coalesced(daemon, sent, took, "reloaded resources=")
    queries = standin.commands().count("get_default_active_thread_percentage")
    wait_until(  # still checking its daemon's health every 100 ms
        lambda: standin.commands().count("get_default_active_thread_percentage") > queries + 2, 10, "health"
    )
    assert root.marker(GPU).exists() and standin.commands().count("-d") == 1
    stop_clean(daemon)
    assert standin.commands()[-1] == "quit" and not root.marker(GPU).exists()
    modes = [
        line.rpartition("mode=")[2]
        for line in daemon.log().splitlines()
        if "simulated compute mode set" in line
    ]
    assert modes[-4:] == ["DEFAULT"] * 4
