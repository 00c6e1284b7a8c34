"""MPS in the plugin, with the kubelet stand-in: a resource advertised only while its control
daemon's ready marker exists (the real `nvdp mps-control-daemon` against the stand-in
`nvidia-cuda-mps-control`), NVIDIA's Allocate answer plus per-container limits, health events on a
GPU marking all its replicas, and every MPS refusal with its exact line."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import grpc
import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import ReplicatedResource, add_plugin_flags, resolve
from nvdp.node.gpus.inventory import mps_misfits
from nvdp.node.gpus.resources import build_resources
from nvdp.node.mps.layout import MpsRoot
from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, free_port, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus, with_facts
from tests.mps_standin import Standin
from tests.readings import http_get

GPU = "nvidia.com/gpu"
MPS4 = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n"
QUARTER = f"{46068 // 4}M"  # pcie-4: L40S, 46068 MiB


def mps_plugin(sock_dir: Path, tmp_path: Path, config: str, env: dict[str, str] | None = None) -> Process:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    return start_plugin(
        sock_dir, "sim:pcie-4", config_file=path, extra=["--mps-root", str(tmp_path / "mps")], env=env
    )


def test_advertised_only_while_the_control_daemon_is_ready(
    sock_dir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    root = MpsRoot(tmp_path / "mps")
    plugin = mps_plugin(sock_dir, tmp_path, MPS4, env={"NVDP_SIM_EVENTS": str(events)})
    standin = Standin(tmp_path / "standin")
    daemon_argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
    daemon_argv += ["--config-file", str(tmp_path / "config.yaml"), "--mps-root", str(root.path)]
    daemon_argv += ["--mps-health-interval", "100ms"]
    daemon: Process | None = None
    try:
        wait_until(lambda: "waiting for the MPS control daemon" in plugin.log(), timeout=20, what="wait line")
        assert GPU not in kubelet.resources()
        daemon = Process(daemon_argv, tmp_path / "daemon.log", standin.env(clean_env()))
        kubelet.wait_for_registration(GPU, timeout=20)
        assert root.marker(GPU).exists()
        devices = kubelet.wait_for_devices(GPU, lambda d: len(d) == 16, timeout=10)
        gpu0 = sim_gpus("pcie-4")[0].uuid
        answer = kubelet.allocate(GPU, [[f"{gpu0}::2"]]).container_responses[0]
        pipe = str(root.pipe_dir(GPU))
        assert dict(answer.envs) == {
            "NVIDIA_VISIBLE_DEVICES": gpu0,
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={QUARTER}",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        }
        assert [(m.container_path, m.host_path) for m in answer.mounts] == [
            (pipe, pipe),
            ("/dev/shm", str(root.shm_dir)),
        ]
        # MPS's default failRequestsGreaterThanOne: one replica per container
        with pytest.raises(grpc.RpcError, match="maximum request size for shared resources is 1"):
            kubelet.allocate(GPU, [[f"{gpu0}::0", f"{gpu0}::1"]])
        # an XID on GPU 0 marks all four of its replicas
        append_sim_event(events, uuid=gpu0, xid=79)
        kubelet.wait_for_devices(
            GPU,
            lambda d: (
                {i for i, s in d.items() if s.health != "Healthy"} == {f"{gpu0}::{n}" for n in range(4)}
            ),
            timeout=10,
        )
        assert len(devices) == 16
        # the daemon dies: the resource goes with it, and comes back with the restarted daemon
        standin.kill_daemon(root.pipe_dir(GPU))
        kubelet.wait_for_stream_closed(GPU, timeout=10)
        kubelet.wait_for_registration(GPU, count=2, timeout=20)
        kubelet.wait_for_devices(GPU, lambda d: len(d) == 16, timeout=10)
        daemon.send(signal.SIGTERM)
        assert daemon.wait(10) == 0
        kubelet.wait_for_stream_closed(GPU, timeout=10)
    finally:
        plugin.stop()
        if daemon is not None:
            daemon.stop()
    assert "Traceback" not in plugin.log() + (daemon.log() if daemon else "")


def test_a_daemon_that_cannot_start_is_named_by_the_plugin_and_readyz(
    sock_dir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    """Issue 17 case 12: no `nvidia-cuda-mps-control` on the node. The plugin says why the resource is
    not served (first that no marker is there yet, then the daemon's reason), and is not ready."""
    root = MpsRoot(tmp_path / "mps")
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(MPS4)
    plugin = start_plugin(
        sock_dir,
        "sim:pcie-4",
        config_file=config,
        metrics_address=f"127.0.0.1:{port}",
        extra=["--mps-root", str(root.path)],
    )
    daemon_argv = [sys.executable, "-m", "nvdp.cli", "mps-control-daemon", "--nvml", "sim:pcie-4"]
    daemon_argv += ["--config-file", str(config), "--mps-root", str(root.path)]
    no_binary = clean_env({"PATH": str(tmp_path / "empty-bin")})
    daemon: Process | None = None
    waiting = f"{GPU}: waiting for the MPS control daemon"
    try:
        starting = (
            f"{waiting} (no ready marker at {root.marker(GPU)}); not advertised reason=MpsDaemonNotReady"
        )
        wait_until(lambda: starting in plugin.log(), 20, "the waiting line")
        daemon = Process(daemon_argv, tmp_path / "daemon.log", no_binary)
        why = f"{waiting}: nvidia-cuda-mps-control not found; not advertised"
        wait_until(lambda: f"{why} reason=MpsDaemonNotReady" in plugin.log(), 20, "the reason")
        withheld = (503, f"withheld by a node fact: {GPU} ({why})\n")
        wait_until(lambda: http_get(port, "/readyz") == withheld, 10, "/readyz")
        assert 'nvdp_node_misfits{reason="MpsDaemonNotReady"} 1' in http_get(port, "/metrics")[1]
        assert GPU not in kubelet.resources() and "no devices found" not in plugin.log()
        daemon.send(signal.SIGTERM)
        assert daemon.wait(10) == 0
        wait_until(lambda: plugin.log().count(starting) == 2, 10, "back to waiting for a marker")
    finally:
        plugin.stop()
        if daemon is not None:
            daemon.stop()
    assert plugin.log().count(why) == 1  # retried by the daemon, said once
    assert "Traceback" not in plugin.log() + (daemon.log() if daemon else "")


def test_per_container_limits_follow_the_replicas_received(
    sock_dir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    root = MpsRoot(tmp_path / "mps")
    root.resource_dir(GPU).mkdir(parents=True)
    root.marker(GPU).touch()  # as the control daemon does once it is ready
    config = MPS4.replace("  mps:\n", "  mps:\n    failRequestsGreaterThanOne: false\n")
    with mps_plugin(sock_dir, tmp_path, config):
        kubelet.wait_for_registration(GPU, timeout=20)
        gpu0, gpu1 = (g.uuid for g in sim_gpus("pcie-4")[:2])
        same, spread = kubelet.allocate(
            GPU, [[f"{gpu0}::0", f"{gpu0}::1"], [f"{gpu0}::3", f"{gpu1}::0"]]
        ).container_responses
        assert same.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={46068 // 2}M"
        assert same.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert spread.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu0},{gpu1}"
        assert spread.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={QUARTER},1={QUARTER}"
        assert spread.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


# ---- refusals --------------------------------------------------------------------------------------


def plugin_problems(argv: list[str], text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    with pytest.raises(ConfigError) as info:
        resolve(parser.parse_args(["--config-file", str(path), *argv]), {})
    return [p.split(": ", 1)[1] if p.startswith(str(path)) else p for p in info.value.problems]


@pytest.mark.parametrize(
    ("argv", "text", "expected"),
    [
        pytest.param(
            ["--mps-root=/run/nvidia/mps"],
            MPS4.replace("replicas: 4", "replicas: 49"),
            ["sharing.mps.resources[0].replicas: 49 is more than MPS supports (48 clients per GPU)"],
            id="replicas",
        ),
        pytest.param(
            ["--mps-root=/run/nvidia/mps"],
            MPS4 + "      devices: ['0:1', MIG-1c6f3a6e-0d2e-4f9b-8c5a-6d9e7f1a2b3c]\n",
            [
                "sharing.mps.resources[0].devices: '0:1' is a MIG device; MPS shares whole GPUs only",
                "sharing.mps.resources[0].devices: 'MIG-1c6f3a6e-0d2e-4f9b-8c5a-6d9e7f1a2b3c' is a MIG "
                "device; MPS shares whole GPUs only",
            ],
            id="mig-devices",
        ),
        pytest.param(
            ["--mps-root=/run/nvidia/mps", "--mig-strategy=mixed"],
            MPS4,
            [
                'sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
                "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)"
            ],
            id="mixed",
        ),
        pytest.param(
            ["--mps-root=/run/nvidia/mps"],
            "version: v1\nsharing:\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n"
            "  mps: {resources: [{name: gpu, replicas: 2}]}\n",
            ["sharing: timeSlicing and mps are mutually exclusive; configure only one"],
            id="time-slicing-and-mps",
        ),
    ],
)
def test_config_refusals(argv: list[str], text: str, expected: list[str], tmp_path: Path) -> None:
    assert plugin_problems(argv, text, tmp_path) == expected


def test_node_misfits() -> None:
    mps = (ReplicatedResource("nvidia.com/gpu", 20, strategy="mps"),)
    mig = sim_gpus("dgx-a100-mig")[3:4]  # one GPU, MIG 7g.40gb
    assert [
        m.message
        for m in mps_misfits(build_resources(mig, mig_strategy="single", sharing=mps).resources, mig)
    ] == [
        "sharing.mps: nvidia.com/gpu: MPS is not supported on MIG devices (MIG device 3:0 would be shared); "
        "not advertised"
    ]
    volta = [with_facts(g, compute_capability=(7, 0)) for g in sim_gpus("pcie-4")[:1]]
    assert [m.message for m in mps_misfits(build_resources(volta, sharing=mps).resources, volta)] == [
        "sharing.mps: nvidia.com/gpu: 20 replicas are more than MPS supports on GPU 0 "
        "(compute capability 7.0: 16 clients); not advertised"
    ]
    turing = [with_facts(g, compute_capability=(7, 5)) for g in sim_gpus("pcie-4")[:1]]
    assert mps_misfits(build_resources(turing, sharing=mps).resources, turing) == []


def test_node_misfit_is_one_warning_and_the_plugin_keeps_running(sock_dir: Path, tmp_path: Path) -> None:
    node = tmp_path / "mig.yaml"
    node.write_text("gpus:\n  - name: NVIDIA A100-SXM4-40GB\n    mig: [7g.40gb]\n")
    config = tmp_path / "c.yaml"
    config.write_text(MPS4)
    plugin = start_plugin(
        sock_dir,
        f"sim:{node}",
        config_file=config,
        extra=["--mig-strategy", "single", "--mps-root", str(tmp_path / "mps")],
    )
    line = (
        "sharing.mps: nvidia.com/gpu: MPS is not supported on MIG devices (MIG device 0:0 would be shared); "
        "not advertised reason=MpsUnsupported"
    )
    with plugin:
        wait_until(lambda: line in plugin.log(), 20, "the misfit line")
        assert plugin.alive()
        assert plugin.log().count(line) == 1
    assert "Traceback" not in plugin.log()


def test_simulate_shows_the_mps_resource_and_a_container_answer(tmp_path: Path) -> None:
    from tests.test_simulate import run_simulate

    config = tmp_path / "mps.yaml"
    config.write_text(MPS4)
    result = run_simulate("--profile", "pcie-4", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("MPS: the simulated node has no nvidia-cuda-mps-control, so no MPS control daemon")
    assert "nvidia.com/gpu                 16 devices" in out
    assert f"env        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={QUARTER}" in out
    assert "env        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in out
    assert "/mps/nvidia.com/gpu/pipe -> /" in out and "/mps/shm -> /dev/shm" in out


def test_marker_directories_join_the_supervisors_inotify_watch(tmp_path: Path) -> None:
    from nvdp.base.dir_watch import DirWatcher
    from nvdp.node.gpus.resources import build_resources
    from nvdp.node.mps.ready import MpsReadiness

    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    root = MpsRoot(tmp_path / "mps")
    watcher = DirWatcher(plugin_dir)
    try:
        assert watcher.uses_inotify
        gpus = sim_gpus("pcie-4")
        resources = build_resources(gpus, sharing=(ReplicatedResource(GPU, 4, strategy="mps"),)).resources
        gate = MpsReadiness()
        assert gate.filter(resources, str(root.path)).resources == []  # no marker: not served
        root.path.mkdir()
        assert not gate.changed(watcher)  # watches the MPS root, the nearest existing directory
        root.resource_dir(GPU).mkdir(parents=True)
        assert watcher.wait(5.0)  # woken by the directory the daemon created, not by a timer
        assert not gate.changed(watcher)  # now watches <root>/nvidia.com/gpu itself
        root.marker(GPU).touch()
        assert watcher.wait(5.0)
        assert gate.changed(watcher)
        assert [r.name for r in gate.filter(resources, str(root.path)).resources] == [GPU]
        assert not watcher.wait(0.05)  # nothing else happened
        root.marker(GPU).unlink()
        assert watcher.wait(5.0) and gate.changed(watcher)
    finally:
        watcher.close()


def test_a_directory_made_while_the_supervisor_looks_still_wakes_it(tmp_path: Path) -> None:
    """The daemon creates `<root>/nvidia.com/gpu` between `changed()` finding it missing and the
    watch on the root: the marker made in it must still wake the supervisor (it used to sleep on
    until something else woke it, and the resource was never served)."""
    from nvdp.base.dir_watch import DirWatcher
    from nvdp.node.mps.ready import MpsReadiness

    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    root = MpsRoot(tmp_path / "mps")
    root.path.mkdir()
    inner = DirWatcher(plugin_dir)

    class DaemonRacingWatcher:
        def add(self, directory: Path) -> bool:
            if directory == root.path and not root.resource_dir(GPU).exists():
                root.resource_dir(GPU).mkdir(parents=True)  # the daemon's mkdir lands now
            return inner.add(directory)

    try:
        gpus = sim_gpus("pcie-4")
        resources = build_resources(gpus, sharing=(ReplicatedResource(GPU, 4, strategy="mps"),)).resources
        gate = MpsReadiness()
        assert gate.filter(resources, str(root.path)).resources == []
        assert not gate.changed(DaemonRacingWatcher())
        root.marker(GPU).touch()
        assert inner.wait(5.0)
        assert gate.changed(inner)
    finally:
        inner.close()
