"""Nothing holds a stop back: SIGTERM during a reload that blocks stops the plugin at once, cleanly;
a stop stuck in a hung NVML call ends at the deadline or at a second SIGTERM, sockets and lock
removed; the MPS control daemon with hung `nvidia-cuda-mps-control` commands stops within a few
seconds, compute modes restored first and the hung commands killed."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from nvdp.base.signals import ABANDON_BUDGET_S
from nvdp.base.timers import as_env
from nvdp.node.mps.layout import MpsRoot
from nvdp.node.nvml import open_nvml
from nvdp.plugins.deviceplugin.supervisor import DaemonSettings
from nvdp.plugins.kubeletplugin.dir_lock import LOCK_NAME
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until, write_time_slicing_config
from tests import test_supervisor
from tests.builders import append_sim_event, sim_gpus
from tests.mps_standin import Standin
from tests.test_mps_daemon import daemon_process
from tests.test_supervisor import Rig

GPU = "nvidia.com/gpu"
SHORT_DEADLINE_S = 1.5  # the stop deadline of the plugin stuck in NVML (production: 10 s)
settings = test_supervisor.settings  # the supervisor rig's settings (fixture, by name)


class BlockingReloadRig(Rig):
    """The supervisor rig whose reload source blocks until `release` (a config read on a hung
    mount, a FIFO with no writer)."""

    def __init__(self, tmp_path: Path, settings: DaemonSettings) -> None:
        self.loading = threading.Event()
        self.release = threading.Event()
        super().__init__(tmp_path, settings)

    def _reload(self) -> DaemonSettings:
        self.loading.set()
        self.release.wait(30)
        return super()._reload()


def test_supervisor_stops_while_its_reload_source_blocks(tmp_path: Path, settings: DaemonSettings) -> None:
    rig = BlockingReloadRig(tmp_path, settings).start()
    try:
        assert rig.supervisor.ready.wait(5)
        (server,) = rig.supervisor.servers.values()
        rig.reload(settings)
        assert rig.loading.wait(5)
        began = time.monotonic()
        rig.stop()  # asserts the loop ended within 5 s
        assert time.monotonic() - began < 1.0
        assert server.stopped and rig.health.stopped and rig.watchers[0].closed
        assert rig.observer.of("reloaded") == []  # the reload was left, not applied
    finally:
        rig.release.set()


@pytest.mark.soak
def test_plugin_sigterm_during_a_blocked_reload_exits_0_and_cleans_up(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    config = write_time_slicing_config(sock_dir / "config.yaml", replicas=2)
    plugin = start_plugin(kubelet.plugin_dir, config_file=config)
    processes.append(plugin)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 16, timeout=30)
    assert (kubelet.plugin_dir / LOCK_NAME).exists()
    config.unlink()
    os.mkfifo(config)  # nobody ever writes: opening it to read waits for a writer
    plugin.send(signal.SIGHUP)
    wait_until(lambda: "reloading configuration" in plugin.log(), 10, "reload started")
    began = time.monotonic()
    plugin.send(signal.SIGTERM)
    assert plugin.wait(10) == 0, plugin.log()[-3000:]
    assert time.monotonic() - began < 2.0
    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == [
        "config.yaml",
        "kubelet.sock",
        "plugin.log",
    ]
    assert "Traceback" not in plugin.log()


def test_a_hung_simulated_gpu_blocks_enumeration_until_restored() -> None:
    nvml = open_nvml("sim:pcie-4")
    nvml.init()
    uuid = sim_gpus("pcie-4")[2].uuid
    nvml.inject({"uuid": uuid, "event": "gpu-hung"})  # type: ignore[attr-defined]
    listed: list[int] = []
    thread = threading.Thread(target=lambda: listed.append(len(nvml.gpus())), daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive() and listed == []
    nvml.inject({"uuid": uuid, "event": "gpu-restored"})  # type: ignore[attr-defined]
    thread.join(5)
    assert listed == [4]
    nvml.shutdown()


def plugin_stuck_in_nvml(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path, timers: Mapping[str, str] | None = None
) -> Process:
    """A plugin whose reload is blocked in NVML: its GPU enumeration hangs (`gpu-hung`). `timers`:
    its `nvdp.base.timers` (production's by default)."""
    events = sock_dir / "events"
    events.touch()
    plugin = start_plugin(kubelet.plugin_dir, env={"NVDP_SIM_EVENTS": str(events), **(timers or {})})
    processes.append(plugin)
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=30)
    assert {p.name for p in kubelet.plugin_dir.iterdir()} >= {"nvidia-gpu.sock", LOCK_NAME}
    append_sim_event(events, uuid=sim_gpus("dgx-a100")[0].uuid, event="gpu-hung")
    wait_until(lambda: "event=gpu-hung" in plugin.log(), 10, "the GPU hung")
    plugin.send(signal.SIGHUP)
    wait_until(lambda: "enumeration blocked by a hung GPU" in plugin.log(), 10, "reload stuck in NVML")
    plugin.send(signal.SIGTERM)
    wait_until(lambda: "signal received; stopping" in plugin.log(), 10, "stop requested")
    return plugin


def test_plugin_stuck_in_nvml_exits_at_a_second_sigterm_and_cleans_up(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    plugin = plugin_stuck_in_nvml(kubelet, processes, sock_dir)
    assert plugin.alive()
    began = time.monotonic()
    plugin.send(signal.SIGTERM)
    assert plugin.wait(10) == 1
    assert time.monotonic() - began < 2.0
    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == ["events", "kubelet.sock", "plugin.log"]
    assert "second SIGTERM; exiting now without waiting for the stop status=1" in plugin.log()


@pytest.mark.soak
def test_plugin_stuck_in_nvml_is_ended_at_the_stop_deadline(
    kubelet: Kubelet, processes: list[Process], sock_dir: Path
) -> None:
    began = time.monotonic()
    plugin = plugin_stuck_in_nvml(kubelet, processes, sock_dir, as_env(stop_deadline=SHORT_DEADLINE_S))
    assert plugin.wait(SHORT_DEADLINE_S + ABANDON_BUDGET_S + 5) == 1
    assert time.monotonic() - began >= SHORT_DEADLINE_S
    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == ["events", "kubelet.sock", "plugin.log"]
    assert f"stop did not finish within {SHORT_DEADLINE_S:g}s; exiting now status=1" in plugin.log()


TWO_MPS = (
    "version: v1\nsharing:\n  mps:\n    resources:\n"
    "    - {name: gpu, rename: mps-a, replicas: 2, devices: [0, 1]}\n"
    "    - {name: gpu, rename: mps-b, replicas: 2, devices: [2, 3]}\n"
)
MPS_RESOURCES = ("nvidia.com/mps-a", "nvidia.com/mps-b")
QUIT_TIMEOUT_S = 0.5  # a hung `quit` is killed after this (production: 3 s)


def hung_commands(standin: Standin) -> list[int]:
    """Pids of the stand-in's command invocations still running (not the forked `-d` daemons)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv[1:] == [os.fsencode(standin.bin / "nvidia-cuda-mps-control")]:
            found.append(int(entry.name))
    return found


@pytest.mark.soak
def test_mps_daemon_with_hung_control_commands_stops_within_seconds(
    tmp_path: Path, processes: list[Process]
) -> None:
    standin = Standin(tmp_path / "standin")
    config = tmp_path / "config.yaml"
    config.write_text(TWO_MPS)
    root = MpsRoot(tmp_path / "mps")
    daemon = daemon_process(tmp_path, standin, config, env=as_env(mps_quit_timeout=QUIT_TIMEOUT_S))
    processes.append(daemon)
    wait_until(lambda: all(root.marker(r).exists() for r in MPS_RESOURCES), 20, "both ready markers")
    before = len(standin.calls())
    standin.hang_command(10**6)  # every command from now on hangs: health queries, quit
    wait_until(lambda: len(standin.calls()) > before and hung_commands(standin), 10, "a hung health query")
    began = time.monotonic()
    daemon.send(signal.SIGTERM)
    assert daemon.wait(20) == 0, daemon.log()[-3000:]
    took = time.monotonic() - began
    assert took < QUIT_TIMEOUT_S + 3.0, f"stopped after {took:.1f}s"
    log = daemon.log().splitlines()
    modes = [line.rpartition("mode=")[2] for line in log if "simulated compute mode set" in line]
    assert modes == ["EXCLUSIVE_PROCESS"] * 4 + ["DEFAULT"] * 4  # recorded by the simulated node
    restored = max(i for i, line in enumerate(log) if "simulated compute mode set" in line)
    quits = [i for i, line in enumerate(log) if "MPS daemon quit failed" in line]
    assert len(quits) == 2 and restored < min(quits)  # compute modes first, then the quits
    assert not any(root.marker(r).exists() for r in MPS_RESOURCES)
    assert hung_commands(standin) == []  # killed, not left behind
    assert "Traceback" not in daemon.log()
