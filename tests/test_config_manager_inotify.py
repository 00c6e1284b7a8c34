"""The config-manager's loop waits on inotify in the source directory: an edit of the ConfigMap (the
kubelet's `..data` swap) or a file written in place is applied at once, and nothing wakes the loop
while nothing changes (no poll)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.side.configmanager.manager import ConfigManager, Outcome
from nvdp.side.configmanager.settings import Settings
from testkit import Process, clean_env, wait_until
from tests import test_config_manager
from tests.kube_api_standin import KubeApiStandin
from tests.test_config_manager import NODE, ConfigMapDir, ts

# test_config_manager's fixture (the Kubernetes API stand-in serving the Node), used here by name
api = test_config_manager.api


class CountingManager(ConfigManager):
    passes = 0

    def reconcile(self) -> Outcome:
        self.passes += 1
        return super().reconcile()


Running = tuple[CountingManager, ConfigMapDir, Path]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    src = ConfigMapDir(tmp_path / "src", {"a": ts(2)})
    dst = tmp_path / "dst" / "config.yaml"
    settings = Settings(
        node_name="n",
        config_file_srcdir=str(src.root),
        config_file_dst=str(dst),
        send_signal=False,
        poll_interval=0.01,  # what a poll would do; inotify makes it unused
    )
    manager = CountingManager(settings)
    manager.set_labels({"nvidia.com/device-plugin.config": "a"})
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(lambda: dst.is_symlink(), 10, "first link")
    yield manager, src, dst
    stop.set()
    manager.wake()
    thread.join(5)
    assert not thread.is_alive(), "the loop did not stop"


def test_idle_loop_does_not_wake_and_edits_apply_at_once(running: Running) -> None:
    manager, src, dst = running
    time.sleep(0.5)  # idle: a 10 ms poll would have run ~50 passes here
    assert manager.passes == 1
    src.update({"a": ts(4)})  # the kubelet's update: new ..<timestamp> dir, ..data swapped
    wait_until(lambda: manager.applied_total == 2, 10, "edit applied")
    assert "replicas: 4" in dst.read_text()
    manager.set_labels({"nvidia.com/device-plugin.config": "b"})  # unknown: reported, no change
    wait_until(lambda: manager.refused_total == 1, 10, "label woke the loop")


def test_a_file_written_in_place_in_a_plain_directory(tmp_path: Path) -> None:
    src = tmp_path / "plain"
    src.mkdir()
    (src / "a").write_text(ts(2))
    dst = tmp_path / "dst" / "config.yaml"
    manager = ConfigManager(
        Settings(
            node_name="n",
            config_file_srcdir=str(src),
            config_file_dst=str(dst),
            send_signal=False,
            poll_interval=3600,  # a poll would never see the write within the test
        )
    )
    manager.set_labels({"nvidia.com/device-plugin.config": "a"})
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: dst.is_symlink(), 10, "first link")
        with open(src / "a", "w") as f:  # in place, same inode
            f.write(ts(3))
        wait_until(lambda: manager.applied_total == 2, 10, "in-place write applied")
        assert os.readlink(dst) == str(src / "a")
    finally:
        stop.set()
        manager.wake()
        thread.join(5)


def test_sigterm_wakes_the_waiting_loop(
    tmp_path: Path, api: KubeApiStandin, processes: list[Process]
) -> None:
    src = ConfigMapDir(tmp_path / "src", {"a": ts(2)})
    argv = [sys.executable, "-m", "nvdp.cli", "config-manager", "--node-name", NODE]
    argv += ["--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig"))]
    argv += ["--config-file-srcdir", str(src.root), "--config-file-dst", str(tmp_path / "dst" / "c.yaml")]
    argv += ["--default-config", "a", "--send-signal", "false"]
    manager = Process(argv, tmp_path / "manager.log", clean_env())
    processes.append(manager)
    wait_until(lambda: "config applied" in manager.log(), 30, "first pass")
    manager.send(signal.SIGTERM)
    assert manager.wait(10) == 0
