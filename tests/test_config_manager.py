"""`nvdp config-manager` as a process, against the Kubernetes API stand-in (real `kubernetes`
client) with a real plugin process started as `nvidia-device-plugin` and the kubelet stand-in.

The plugin is started from a copy of the console script in a per-test directory and the manager is
told its absolute path (`--process-to-signal /.../nvidia-device-plugin`), so tests running beside
ours on the same machine never get our signals.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.base.timers import as_env
from nvdp.sim.kubelet import Kubelet
from testkit import Process, ProcStats, clean_env, wait_until
from tests.kube_api_standin import KubeApiStandin

GPU = "nvidia.com/gpu"
NODE = "node-a"
NODE_PATH = f"/api/v1/nodes/{NODE}"
LABEL = "nvidia.com/device-plugin.config"
EVENTS = "/api/v1/namespaces/default/events"


def ts(replicas: int) -> str:
    resources = f"[{{name: nvidia.com/gpu, replicas: {replicas}}}]"
    return f"version: v1\nsharing:\n  timeSlicing:\n    resources: {resources}\n"


class ConfigMapDir:
    """A directory laid out as the kubelet mounts a ConfigMap: `..<stamp>/` holds the files,
    `..data` links to it, and each entry `name` links to `..data/name`. `update` swaps `..data`."""

    def __init__(self, root: Path, entries: dict[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.generation = 0
        self.update(entries)

    def update(self, entries: dict[str, str]) -> None:
        self.generation += 1
        stamp = self.root / f"..2026_11_23_00_00_{self.generation:02d}"
        stamp.mkdir()
        for name, text in entries.items():
            (stamp / name).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(stamp.name)
        os.replace(tmp, self.root / "..data")
        for name in entries:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    with KubeApiStandin() as standin:
        standin.put(NODE_PATH, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        yield standin


def console_script(bin_dir: Path, name: str, entry: str) -> Path:
    """A per-test copy of the console script `name` (calling `nvdp.cli.<entry>`): the config-manager
    is told its absolute path, so tests beside ours never get our signals."""
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / name
    exe.write_text(f"#!{sys.executable}\nimport sys\nfrom nvdp.cli import {entry}\nsys.exit({entry}())\n")
    exe.chmod(0o755)
    return exe


def manager_argv(kubeconfig: Path, src: Path, dst: Path, signalled: Path, *extra: str) -> list[str]:
    """`nvdp config-manager` for NODE, signalling `signalled` (no --poll-interval: ConfigMap edits
    are seen through inotify)."""
    argv = [sys.executable, "-m", "nvdp.cli", "config-manager", "--kubeconfig", str(kubeconfig)]
    argv += ["--node-name", NODE, "--config-file-srcdir", str(src), "--config-file-dst", str(dst)]
    return [*argv, "--process-to-signal", str(signalled), *extra]


class Setup:
    def __init__(self, base: Path, api: KubeApiStandin, kubelet: Kubelet, processes: list[Process]) -> None:
        self.base, self.api, self.kubelet, self.processes = base, api, kubelet, processes
        self.kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        self.src = ConfigMapDir(base / "src", {"a": ts(2), "b": ts(4), "default": "version: v1\n"})
        self.dst = base / "dst" / "config.yaml"
        self.plugin_exe = console_script(base / "bin", "nvidia-device-plugin", "plugin_main")

    def manager(self, *extra: str, log: str = "manager.log", **env: str) -> Process:
        """`nvdp config-manager`, its Node watch retried after 0.05 s, 0.1 s, ... (production: 0.8 s, ...)."""
        argv = manager_argv(self.kubeconfig, self.src.root, self.dst, self.plugin_exe, *extra)
        process = Process(argv, self.base / log, clean_env({**as_env(watch_backoff=0.05), **env}))
        self.processes.append(process)
        return process

    def plugin(self) -> Process:
        argv = [str(self.plugin_exe), "--nvml", "sim:dgx-a100", "--kubelet-socket"]
        argv += [str(self.kubelet.plugin_dir / "kubelet.sock"), "--metrics-address", ""]
        argv += ["--config-file", str(self.dst)]
        process = Process(argv, self.base / "plugin.log", clean_env())
        self.processes.append(process)
        return process

    def label(self, value: str | None) -> None:
        self.api.patch_labels(NODE_PATH, {LABEL: value})

    def wait_devices(self, count: int, timeout: float = 15) -> None:
        self.kubelet.wait_for_devices(GPU, lambda d: len(d) == count, timeout=timeout)


@pytest.fixture
def setup(tmp_path: Path, api: KubeApiStandin, kubelet: Kubelet, processes: list[Process]) -> Setup:
    return Setup(tmp_path, api, kubelet, processes)


def _events(setup: Setup, reason: str) -> list[dict[str, object]]:
    return [e for e in setup.api.created if e["reason"] == reason]


def _reloads(plugin: Process) -> int:
    return plugin.log().count("SIGHUP received")


def _signalled(manager: Process) -> int:
    return manager.log().count(" signalled ")


def _wait_signalled(manager: Process, plugin: Process, count: int) -> None:
    """Wait for the manager's `count`th signal and the plugin's reload on it. Both lines may come after
    the plugin already serves the new config (each is logged once its signal or reload was sent on),
    so a count taken when the devices change can be short; `count` is the total from the start."""
    wait_until(lambda: _signalled(manager) >= count and _reloads(plugin) >= count, 10, f"signal {count}")


@pytest.mark.soak
def test_label_switches_the_plugin_config_live(setup: Setup) -> None:
    setup.label("a")
    init = setup.manager("--oneshot", log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()
    assert os.readlink(setup.dst) == str(setup.src.root / "a")

    plugin = setup.plugin()
    setup.wait_devices(16, timeout=30)  # 8 GPUs x 2 replicas
    manager = setup.manager("--fallback-strategies", "named")
    wait_until(lambda: "watching node label" in manager.log(), 20, "manager start")
    assert manager.alive()

    # Label changed to b: the plugin serves 4 replicas within seconds, same process.
    setup.label("b")
    setup.wait_devices(32)
    _wait_signalled(manager, plugin, 1)
    assert plugin.alive()

    # Unknown value: one line and one Event; both keep running on the old config.
    setup.label("nope")
    wait_until(lambda: _events(setup, "DevicePluginConfigRefused"), 10, "node event")
    (event,) = _events(setup, "DevicePluginConfigRefused")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == NODE and "'nope'" in event["message"]
    wait_until(lambda: "config not applied" in manager.log(), 10, "refusal logged")
    assert manager.alive() and plugin.alive() and len(setup.kubelet.devices(GPU)) == 32
    assert len(_events(setup, "DevicePluginConfigRefused")) == 1
    assert os.readlink(setup.dst) == str(setup.src.root / "b")

    # Label removed: the `named` fallback picks the entry called default (no sharing).
    setup.label(None)
    setup.wait_devices(8)
    _wait_signalled(manager, plugin, 2)

    # API errors, then recovery: the watch retries and resumes.
    setup.api.fail(500, 2, watch=True)
    setup.api.end_watches()
    wait_until(lambda: manager.log().count("node watch failed") >= 2, 15, "watch failures logged")
    setup.label("a")
    setup.wait_devices(16)
    _wait_signalled(manager, plugin, 3)
    assert "node watch recovered" in manager.log()

    # History compacted: the resumed watch gets 410 Gone and lists again.
    setup.api.expire()
    setup.api.end_watches()
    setup.label("b")
    setup.wait_devices(32)
    _wait_signalled(manager, plugin, 4)
    assert "410 Gone" in manager.log()

    # The ConfigMap entry edited in place (the kubelet swaps ..data): re-applied and signalled.
    setup.src.update({"a": ts(2), "b": ts(3), "default": "version: v1\n"})
    setup.wait_devices(24)
    _wait_signalled(manager, plugin, 5)
    assert plugin.alive() and manager.alive()

    # An edit that the plugin would refuse is not applied (and not signalled).
    setup.label("a")
    setup.wait_devices(16)
    _wait_signalled(manager, plugin, 6)
    setup.src.update({"a": ts(2), "b": "sharing: {timeSlicing: {resources: [{name: gpu, replicas: x}]}}\n"})
    setup.label("b")
    wait_until(lambda: "replicas: must be an integer" in manager.log(), 10, "invalid entry reported")
    assert os.readlink(setup.dst) == str(setup.src.root / "a")

    # Memory while watching (bench/config_manager.py measures it on its own): under 80 MB.
    assert ProcStats.read(manager.pid).peak_rss_mib * 1024 * 1024 < 80e6
    assert manager.stop() == 0
    assert plugin.stop() == 0
    # Both logs are complete now, so the counts are exact, with no wait for a line that never comes:
    # one signal and one reload per applied change (six), none for a refusal; the refused label
    # reported once.
    assert _signalled(manager) == _reloads(plugin) == 6, (manager.log(), plugin.log())
    refused = [line for line in manager.log().splitlines() if "config not applied" in line]
    assert len(refused) == 2, refused  # 'nope', then the invalid entry b
    assert "node=node-a" in refused[0] and "label=nope" in refused[0]
    assert "no config entry named 'nope'" in refused[0]


@pytest.mark.soak
def test_oneshot_with_an_unknown_label_falls_back_and_reports(setup: Setup) -> None:
    setup.label("nope")
    init = setup.manager("--oneshot", "--fallback-strategies", "named", log="init.log", SEND_SIGNAL="false")
    assert init.wait(30) == 0, init.log()
    assert os.readlink(setup.dst) == str(setup.src.root / "default")
    assert [e["reason"] for e in setup.api.created] == ["DevicePluginConfigRefused"]
    assert "using default" in init.log()


@pytest.mark.soak
def test_sighup_is_sent_only_when_the_file_changes(setup: Setup) -> None:
    """A stand-in process named like the plugin counts the SIGHUPs it gets."""
    counter = setup.base / "hups"
    script = setup.plugin_exe
    script.write_text(
        f"#!{sys.executable}\nimport signal, time\n"
        f"def hup(*_):\n    open({str(counter)!r}, 'a').write('h')\n"
        "signal.signal(signal.SIGHUP, hup)\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n"
    )
    target = Process([str(script)], setup.base / "target.log", clean_env())
    setup.processes.append(target)
    wait_until(lambda: "ready" in target.log(), 10, "target ready")
    setup.label("a")
    manager = setup.manager()
    wait_until(lambda: counter.exists(), 20, "first signal")
    setup.label("b")
    wait_until(lambda: counter.read_text() == "hh", 10, "second signal")
    setup.label("b2")  # unknown: no signal
    wait_until(lambda: "label=b2" in manager.log(), 10, "b2 refused")
    setup.api.patch_labels(NODE_PATH, {"unrelated": "x"})  # other labels: no signal
    manager.send(signal.SIGHUP)  # reconcile now: nothing changed, no signal
    setup.label("a")  # one more signal, sent after any the three above could have caused
    wait_until(lambda: "entry=a" in manager.log().rsplit("label=b2", 1)[-1], 10, "a applied again")
    assert manager.stop() == 0
    # The manager's log is complete: three signals, so none for the three changes in between.
    assert manager.log().count(" signalled ") == 3
    wait_until(lambda: counter.read_text() == "hhh", 10, "the third signal handled")


@pytest.mark.soak
def test_oneshot_failures_are_one_line_and_exit_1(setup: Setup) -> None:
    setup.label("nope")  # no default, no fallback: nothing can be put in place
    init = setup.manager("--oneshot", log="nothing.log", SEND_SIGNAL="false")
    assert init.wait(30) == 1
    lines = [line for line in init.log().splitlines() if "ERROR" in line]
    assert len(lines) == 1 and "no config entry named 'nope'" in lines[0], init.log()
    assert "Traceback" not in init.log() and not setup.dst.exists()

    setup.api.stop()  # the API server is gone
    init = setup.manager("--oneshot", "--fallback-strategies", "named", log="noapi.log", SEND_SIGNAL="false")
    assert init.wait(30) == 1
    assert "Traceback" not in init.log()
    (line,) = [line for line in init.log().splitlines() if "ERROR" in line]
    assert "exiting error=" in line and "cannot read node node-a" in line
