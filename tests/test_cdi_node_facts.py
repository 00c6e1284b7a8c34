"""`nvdp plugin` with a CDI strategy against node facts, as a process driven by the kubelet stand-in:
a missing device node leaves out its GPU only and its return brings the GPU back; with none of them
/readyz says why; a spec directory unusable at start is served once it is fixed, without SIGHUP; a spec
removed or overwritten under the plugin is written back; a second plugin on the same spec directory
waits instead of overwriting the first one's specs. Plus the same misfits reaching the misfit report
(its Node events) in-process."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nvdp.base.dir_watch import DirWatcher
from nvdp.config import Config, RuntimeOptions
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.nvml import open_nvml
from nvdp.plugins.deviceplugin.daemon_settings import daemon_settings
from nvdp.plugins.deviceplugin.supervisor import DaemonSettings, Supervisor
from nvdp.sim.kubelet import Kubelet
from testkit import Process, free_port, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.cdi_support import make_char_device, make_node
from tests.fakes import FakeEventSink, FakeFacts, FakeKubelet, FakeServer
from tests.readings import http_get

GPU = "nvidia.com/gpu"
SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
LOCK = ".k8s.device-plugin.nvidia.com.lock"
GPUS = sim_gpus("dgx-a100")


@pytest.fixture
def root(sock_dir: Path) -> Path:
    """A driver root (= dev root) with every driver file and device node of the dgx-a100 node."""
    root = sock_dir / "root"
    make_node(root, GPUS)
    return root


def cdi_plugin(sock_dir: Path, root: Path, spec_dir: Path, port: int | None = None, *extra: str) -> Process:
    return start_plugin(
        sock_dir,
        "sim:dgx-a100",
        metrics_address=f"127.0.0.1:{port}" if port else "",
        extra=[
            "--device-list-strategy=cdi-cri",
            f"--cdi-spec-dir={spec_dir}",
            f"--driver-root={root}",
            f"--container-driver-root={sock_dir / 'no-mount'}",
            *extra,
        ],
    )


def spec_names(spec: Path) -> set[str]:
    return {d["name"] for d in json.loads(spec.read_text())["devices"]}


def warnings(log: str) -> list[str]:
    return [line.split(" WARNING ", 1)[1] for line in log.splitlines() if " WARNING " in line]


@pytest.fixture
def plugins() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()
        print(f"---- plugin\n{process.log()[-6000:]}")


def test_a_missing_device_node_leaves_out_its_gpu_and_its_return_brings_it_back(
    sock_dir: Path, root: Path, kubelet: Kubelet, plugins: list[Process]
) -> None:
    (root / "dev/nvidia3").unlink()
    spec = sock_dir / "cdi" / SPEC
    port = free_port()
    plugin = cdi_plugin(sock_dir, root, sock_dir / "cdi", port)
    plugins.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    served = kubelet.wait_for_devices(GPU, lambda d: len(d) == 7, timeout=10)
    assert GPUS[3].uuid not in served and GPUS[3].uuid not in spec_names(spec)
    line = (
        f"GPU 3 ({GPUS[3].uuid}): /dev/nvidia3 not found under the dev root {root}; not advertised "
        "reason=DeviceNodeMissing"
    )
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "ready: 7 of 8 GPUs served")
    assert warnings(plugin.log()) == [line]
    assert 'nvdp_node_misfits{reason="DeviceNodeMissing"} 1' in http_get(port, "/metrics")[1]
    # the node appears: the GPU is served again, no SIGHUP (the dev directory is watched)
    make_char_device(root / "dev/nvidia3")
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=10)
    assert GPUS[3].uuid in spec_names(spec)
    assert 'nvdp_node_misfits{reason="DeviceNodeMissing"} 0' in http_get(port, "/metrics")[1]
    log = plugin.log()
    assert "resolved reason=DeviceNodeMissing subject=/dev/nvidia3" in log
    assert f"updated devices resource={GPU} devices=8" in log  # the same server and stream: no restart
    (root / "dev/nvidia3").unlink()  # and a node that goes under a serving plugin takes its GPU out
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 7 and GPUS[3].uuid not in d, timeout=10)
    assert GPUS[3].uuid not in spec_names(spec)
    assert "Traceback" not in plugin.log()


def test_no_device_node_at_all_withholds_the_resource_and_readyz_says_why(
    sock_dir: Path, root: Path, kubelet: Kubelet, plugins: list[Process]
) -> None:
    for gpu in GPUS:
        (root / f"dev/nvidia{gpu.minor}").unlink()
    port = free_port()
    plugin = cdi_plugin(sock_dir, root, sock_dir / "cdi", port)
    plugins.append(plugin)
    wait_until(lambda: "nothing served" in plugin.log(), 20, "the nothing-served line")
    why = f"GPU 0 ({GPUS[0].uuid}): /dev/nvidia0 not found under the dev root {root}; not advertised"
    not_ready = (503, f"withheld by a node fact: {GPU} ({why})\n")
    wait_until(lambda: http_get(port, "/readyz") == not_ready, 10, "/readyz naming the missing node")
    assert 'nvdp_node_misfits{reason="DeviceNodeMissing"} 8' in http_get(port, "/metrics")[1]
    lines = warnings(plugin.log())
    assert len(lines) == 9 and lines[-1] == (
        "nothing served although GPUs were found; the warnings above say why gpus=8 reasons=DeviceNodeMissing"
    )
    assert "no devices found" not in plugin.log()
    assert GPU not in kubelet.resources() and plugin.alive()


def test_a_spec_dir_unusable_at_start_is_served_once_fixed_without_sighup(
    sock_dir: Path, root: Path, kubelet: Kubelet, plugins: list[Process]
) -> None:
    # Tests run as root, which a read-only mode does not stop: a file where the directory's parent
    # should be fails every write the same way (one line, retried) until it is replaced.
    blocker = sock_dir / "blocker"
    blocker.write_text("")
    spec_dir = blocker / "cdi"
    port = free_port()
    plugin = cdi_plugin(sock_dir, root, spec_dir, port)
    plugins.append(plugin)
    why = (
        f"cannot use CDI spec directory {spec_dir}: Not a directory; {GPU} not advertised until it can be "
        "written (retrying)"
    )
    wait_until(lambda: f"{why} reason=CdiSpecNotWritten" in plugin.log(), 20, "the spec-dir line")
    not_ready = (503, f"withheld by a node fact: {GPU} ({why})\n")
    wait_until(lambda: http_get(port, "/readyz") == not_ready, 10, "/readyz naming the spec dir")
    assert GPU not in kubelet.resources()
    blocker.unlink()
    blocker.mkdir()
    kubelet.wait_for_registration(GPU, timeout=15)  # the next retry (backoff, at most 10 s) writes it
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=10)
    assert spec_names(spec_dir / SPEC) >= {g.uuid for g in GPUS}
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "ready")
    assert plugin.log().count(why) == 1  # said once, however many retries
    assert "no devices found" not in plugin.log()


def test_a_spec_removed_or_overwritten_under_a_serving_plugin_is_written_back(
    sock_dir: Path, root: Path, kubelet: Kubelet, plugins: list[Process]
) -> None:
    spec = sock_dir / "cdi" / SPEC
    plugin = cdi_plugin(sock_dir, root, sock_dir / "cdi")
    plugins.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    ours = spec.read_bytes()

    def restored() -> bool:
        try:
            return spec.read_bytes() == ours
        except FileNotFoundError:
            return False

    spec.unlink()
    wait_until(restored, 10, "the removed spec written back")
    spec.write_text("{}\n")  # in place, as an editor or `cat >` does
    wait_until(restored, 10, "the spec changed in place written back")
    other = spec.with_name(".other.tmp")
    other.write_text('{"cdiVersion": "0.5.0", "kind": "k8s.device-plugin.nvidia.com/gpu", "devices": []}\n')
    os.replace(other, spec)  # replaced, as another tool's atomic write does
    wait_until(restored, 10, "the replaced spec written back")
    said = [
        "CDI spec removed under the plugin; written back",
        "CDI spec changed under the plugin; written back",
        "CDI spec changed under the plugin; written back",
    ]
    # the line follows the write the test saw
    wait_until(lambda: [w.split(" path=")[0] for w in warnings(plugin.log())] == said, 10, "three lines")
    # Our own writes do not start a rewrite loop: the spec stays the same file. An observation
    # window (not a wait for a condition): nothing may happen in it.
    settled = spec.stat().st_ino
    time.sleep(0.5)
    assert spec.stat().st_ino == settled and len(warnings(plugin.log())) == 3
    assert spec.read_bytes() == ours and len(kubelet.devices(GPU)) == 8


def test_a_second_plugin_on_the_spec_dir_waits_instead_of_overwriting(
    sock_dir: Path, root: Path, kubelet: Kubelet, plugins: list[Process], tmp_path: Path
) -> None:
    spec_dir = sock_dir / "cdi"
    first = cdi_plugin(sock_dir, root, spec_dir)
    plugins.append(first)
    kubelet.wait_for_registration(GPU, timeout=20)
    ours = (spec_dir / SPEC).read_bytes()
    other_dir = sock_dir / "k2"
    other_dir.mkdir()
    port = free_port()
    with Kubelet(other_dir) as other_kubelet:
        # a different config, so its spec would differ: index names
        second = cdi_plugin(other_dir, root, spec_dir, port, "--device-id-strategy=index")
        plugins.append(second)
        held = f"CDI spec directory {spec_dir} is in use by another device plugin "
        held += f"(lock {spec_dir / LOCK} held by "
        wait_until(lambda: held in second.log(), 20, "the in-use line")
        line = next(w for w in warnings(second.log()) if w.startswith(held))
        assert f"held by pid={first.pid} host=" in line
        assert line.endswith(f"); {GPU} not advertised until it is released reason=CdiSpecDirInUse")
        assert http_get(port, "/readyz")[0] == 503 and GPU not in other_kubelet.resources()
        assert (spec_dir / SPEC).read_bytes() == ours  # the first plugin's spec, untouched
        assert kubelet.wait_for_devices(GPU, lambda d: len(d) == 8)  # the first one serves on
        first.send(signal.SIGTERM)
        assert first.wait(10) == 0
        other_kubelet.wait_for_registration(GPU, timeout=15)  # the lock released: the second one serves
        assert spec_names(spec_dir / SPEC) == {"all", *(str(g.index) for g in GPUS)}
        wait_until(lambda: http_get(port, "/readyz")[0] == 200, 10, "second ready")
    assert "Traceback" not in first.log() + second.log()


def test_device_specs_follow_the_same_rule(sock_dir: Path, kubelet: Kubelet, plugins: list[Process]) -> None:
    """--pass-device-specs names the device nodes in every answer: a GPU whose node is missing is left
    out the same way (envvar / volume-mounts alone name none, and nothing is checked there)."""
    dev_root = sock_dir / "host"
    (dev_root / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{g.minor}" for g in GPUS if g.index != 5)):
        (dev_root / "dev" / name).touch()
    plugin = start_plugin(sock_dir, extra=["--pass-device-specs", "--nvidia-dev-root", str(dev_root)])
    plugins.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    assert GPUS[5].uuid not in kubelet.wait_for_devices(GPU, lambda d: len(d) == 7, timeout=10)
    assert warnings(plugin.log()) == [
        f"GPU 5 ({GPUS[5].uuid}): /dev/nvidia5 not found under the dev root {dev_root}; not advertised "
        "reason=DeviceNodeMissing"
    ]
    (dev_root / "dev/nvidia5").touch()
    kubelet.wait_for_devices(GPU, lambda d: len(d) == 8, timeout=10)
    answer = kubelet.allocate(GPU, [[GPUS[5].uuid]]).container_responses[0]
    assert all(os.path.exists(d.host_path) for d in answer.devices)
    assert f"{dev_root}/dev/nvidia5" in [d.host_path for d in answer.devices]


# ---- the same facts reach the misfit report (and so its Node events) -------------------------------


def test_a_missing_device_node_becomes_a_node_event(root: Path, sock_dir: Path) -> None:
    (root / "dev/nvidia3").unlink()
    config = Config()
    plugin = replace(
        config.flags.plugin, device_list_strategy=("cdi-cri",), container_driver_root=str(sock_dir / "x")
    )
    flags = replace(config.flags, plugin=plugin, nvidia_driver_root=str(root))
    settings: DaemonSettings = replace(
        daemon_settings(
            replace(config, flags=flags), runtime=RuntimeOptions(cdi_spec_dir=str(sock_dir / "cdi"))
        ),
        kubelet_socket=sock_dir / "kubelet.sock",
    )
    events = FakeEventSink()
    fake = FakeKubelet()
    supervisor: Supervisor[FakeServer] = Supervisor(
        open_nvml("sim:dgx-a100"),
        settings,
        reload=lambda: settings,
        make_server=FakeServer,
        host_facts=FakeFacts(),
        register=fake.register,
        socket_id=lambda path: fake.socket_id,
        misfits=MisfitReport(events),
        watcher=DirWatcher,
    )
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: events.recorded, 10, "an event")
        assert events.recorded == [
            (
                "Warning",
                "DeviceNodeMissing",
                f"GPU 3 ({GPUS[3].uuid}): /dev/nvidia3 not found under the dev root {root}; not advertised",
            )
        ]
        wait_until(lambda: GPU in supervisor.servers, 10, "the server")
        assert len(supervisor.servers[GPU].resource.devices) == 7
    finally:
        supervisor.request_stop()
        thread.join(10)
    assert not (sock_dir / "cdi" / LOCK).exists() and (sock_dir / "cdi" / SPEC).exists()  # specs stay
