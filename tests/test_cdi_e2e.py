"""`nvdp plugin` with a CDI strategy, as a process driven by the kubelet stand-in: the spec is on
disk before any registration, is rewritten when a SIGHUP finds a new MIG layout (a reader never
sees a partial file), and stays after SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, start_plugin, wait_until
from tests.builders import append_sim_event, sim_gpus
from tests.cdi_support import make_char_device, make_node

SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
MIG_1G = "nvidia.com/mig-1g.5gb"


class SpecWatchingKubelet(Kubelet):
    """The stand-in, noting for each Register whether the CDI spec was already on disk."""

    def __init__(self, plugin_dir: Path, spec: Path) -> None:
        super().__init__(plugin_dir)
        self.spec = spec
        self.spec_at_register: list[tuple[str, bool]] = []
        connected = self.device_state.plugin_connected

        def noting(plugin: Any, registration: Any) -> Any:  # called for every accepted Register
            self.spec_at_register.append((registration.resource, self.spec.is_file()))
            return connected(plugin, registration)

        self.device_state.plugin_connected = noting  # type: ignore[method-assign]


class Reader(threading.Thread):
    """Reads the spec as fast as it can; every read must be a whole JSON document."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.reads = 0
        self.partial: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                self.partial.append("<missing>")
                continue
            try:
                json.loads(text)
            except ValueError:
                self.partial.append(text[-80:])
            self.reads += 1


@pytest.fixture
def root(sock_dir: Path) -> Path:
    root = sock_dir / "root"
    make_node(root, sim_gpus("dgx-a100-mig"))
    for minor in range(3 + 8 * 135):  # every MIG access node a new layout on these GPUs may need
        make_char_device(root / f"dev/nvidia-caps/nvidia-cap{minor}")
    return root


@pytest.fixture
def kubelet_with_spec(sock_dir: Path) -> Iterator[SpecWatchingKubelet]:
    with SpecWatchingKubelet(sock_dir, sock_dir / "cdi" / SPEC) as kubelet:
        yield kubelet


def spec_device_names(spec: Path) -> set[str]:
    return {d["name"] for d in json.loads(spec.read_text())["devices"]}


def test_spec_before_registration_rewritten_on_layout_change_kept_on_stop(
    sock_dir: Path, root: Path, kubelet_with_spec: SpecWatchingKubelet, processes: list[Process]
) -> None:
    kubelet = kubelet_with_spec
    events = sock_dir / "events"
    events.touch()
    spec = sock_dir / "cdi" / SPEC
    gpus = sim_gpus("dgx-a100-mig")
    plugin = start_plugin(
        sock_dir,
        "sim:dgx-a100-mig",
        env={"NVDP_SIM_EVENTS": str(events)},
        extra=[
            "--mig-strategy=mixed",
            "--device-list-strategy=cdi-cri",
            f"--cdi-spec-dir={sock_dir / 'cdi'}",
            f"--driver-root={root}",
            f"--container-driver-root={sock_dir / 'no-mount'}",
        ],
    )
    processes.append(plugin)
    kubelet.wait_for_registration(MIG_1G, timeout=20)
    assert kubelet.spec_at_register and all(seen for _, seen in kubelet.spec_at_register)

    old = {m.uuid for m in gpus[0].mig_devices}
    assert old <= spec_device_names(spec)
    device = next(iter(old))
    answer = kubelet.allocate(MIG_1G, [[device]]).container_responses[0]
    assert [c.name for c in answer.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={device}"]

    reader = Reader(spec)
    reader.start()
    append_sim_event(events, uuid=gpus[0].uuid, mig=["3g.20gb", "3g.20gb"])

    def rewritten() -> bool:
        plugin.send(signal.SIGHUP)  # again until the follower has applied the line
        return not old & spec_device_names(spec)

    wait_until(rewritten, timeout=20, what="spec without GPU 0's old MIG devices", interval=0.3)
    reader.stop.set()
    reader.join(5)
    assert reader.partial == [] and reader.reads > 10
    assert "wrote CDI spec" in plugin.log()

    plugin.stop()
    assert spec.is_file() and not old & spec_device_names(spec)  # specs stay for running containers
    assert "Traceback" not in plugin.log()


def test_imex_required_without_channel_refused_at_start(sock_dir: Path) -> None:
    argv = [sys.executable, "-m", "nvdp.cli", "plugin", "--nvml", "sim:pcie-4"]
    argv += ["--kubelet-socket", str(sock_dir / "kubelet.sock"), "--metrics-address", ""]
    argv += ["--imex-channel-ids=0", "--imex-required", f"--driver-root={sock_dir}"]
    argv += [f"--container-driver-root={sock_dir / 'no-mount'}", "--log-format=json"]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines() if '"cannot start"' in line]
    assert [line["error"] for line in lines] == [
        f"imex.required: IMEX channel 0 not found (/dev/nvidia-caps-imex-channels/channel0 under dev root "
        f"{sock_dir}); create the channel or set imex.required to false"
    ]
