"""Issue 17 case 7: the kubelet directory replaced under a running plugin (a kubelet reinstall
removes and re-creates it, or puts a file or a symlink to another directory in its place; a read-only
directory while the kubelet restarts). The plugin never exits for it and registers again, without a
SIGHUP, once `kubelet.sock` appears at the configured path."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.plugins.kubeletplugin.dir_lock import LOCK_NAME
from nvdp.sim.kubelet import Kubelet
from testkit import Process, free_port, short_temp_dir, start_plugin, wait_until
from tests.readings import http_get

GPU = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"
DEADLINE_S = 10.0  # from kubelet.sock appearing to the registration; it takes well under a second


@pytest.fixture
def other_dir() -> Iterator[Path]:
    """A second short directory (unix socket paths hold 107 bytes)."""
    with short_temp_dir("nvdp-other-") as path:
        yield path


@pytest.fixture
def plugin(sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]) -> Process:
    """A plugin registered with the stand-in; its log outside the directory that is replaced."""
    process = start_plugin(sock_dir, "sim:pcie-4", log_path=tmp_path / "plugin.log")
    processes.append(process)
    settled(process, kubelet)
    return process


def settled(plugin: Process, kubelet: Kubelet) -> None:
    """Registered, its stream open, and the plugin's loop back to waiting."""
    kubelet.wait_for_registration(GPU, timeout=20)
    kubelet.wait_for_devices(GPU, timeout=20)
    wait_until(lambda: "registered with kubelet" in plugin.log(), timeout=10, what="the registered line")


def lock_holder(directory: Path) -> str:
    try:
        return (directory / LOCK_NAME).read_text()
    except OSError:
        return ""


def remove(directory: Path, plugin: Process) -> None:
    """Remove the kubelet directory (kubelet.sock, our socket and lock with it) and wait until the
    plugin has looked at the path without it: the new one then comes after that look. Moved away
    first, so the plugin never sees it half removed (it would lock a new file there, and `rm -rf`
    would find the directory not empty)."""
    trash = directory.with_name(directory.name + ".removed")
    directory.rename(trash)
    shutil.rmtree(trash)
    wait_until(
        lambda: "kubelet directory unusable; retrying" in plugin.log(),
        timeout=10,
        what="the plugin seeing the directory gone",
    )
    line = next(li for li in plugin.log().splitlines() if "kubelet directory unusable" in li)
    assert f"path={directory} " in line and "No such file or directory (ENOENT)" in line


def test_directory_removed_and_recreated(sock_dir: Path, kubelet: Kubelet, plugin: Process) -> None:
    kubelet.stop()
    remove(sock_dir, plugin)
    sock_dir.mkdir()
    kubelet.start()
    kubelet.wait_for_registration(GPU, count=2, timeout=DEADLINE_S)
    kubelet.wait_for_devices(GPU, timeout=DEADLINE_S)
    assert plugin.alive() and "Traceback" not in plugin.log()
    assert lock_holder(sock_dir) == f"pid={plugin.pid}\n", "the lock is taken again in the new directory"
    assert os.stat(sock_dir / SOCKET).st_mode & 0o777 == 0o600


def test_directory_replaced_by_a_symlink(
    sock_dir: Path, other_dir: Path, kubelet: Kubelet, plugin: Process
) -> None:
    kubelet.stop()
    remove(sock_dir, plugin)
    sock_dir.symlink_to(other_dir)
    with Kubelet(sock_dir) as there:  # serves <other_dir>/kubelet.sock through the link
        there.wait_for_registration(GPU, timeout=DEADLINE_S)
        there.wait_for_devices(GPU, timeout=DEADLINE_S)
        assert (other_dir / SOCKET).exists()
        assert lock_holder(other_dir) == f"pid={plugin.pid}\n"
    assert plugin.alive()
    sock_dir.unlink()  # the fixture removes a directory


def test_symlink_repointed_to_another_directory(
    sock_dir: Path, other_dir: Path, tmp_path: Path, processes: list[Process]
) -> None:
    first = other_dir / "first"
    second = other_dir / "second"
    first.mkdir()
    second.mkdir()
    link = other_dir / "dp"
    link.symlink_to(first)
    with Kubelet(link) as kubelet:
        plugin = start_plugin(link, "sim:pcie-4", log_path=tmp_path / "plugin.log")
        processes.append(plugin)
        settled(plugin, kubelet)
        with Kubelet(second) as there:
            swap = other_dir / "dp.new"
            swap.symlink_to(second)
            os.replace(swap, link)  # `ln -sfn`: one rename, the link never missing
            there.wait_for_registration(GPU, timeout=DEADLINE_S)
            assert lock_holder(second) == f"pid={plugin.pid}\n"
    assert plugin.alive()


def test_directory_replaced_by_a_file_then_a_directory_again(
    sock_dir: Path, kubelet: Kubelet, plugin: Process
) -> None:
    kubelet.stop()
    remove(sock_dir, plugin)
    sock_dir.write_text("not a directory\n")
    wait_until(lambda: "Not a directory" in plugin.log(), timeout=10, what="the unusable line")
    line = next(li for li in plugin.log().splitlines() if "Not a directory" in li)
    assert "kubelet directory unusable; retrying" in line
    assert plugin.alive()
    sock_dir.unlink()
    sock_dir.mkdir()
    kubelet.start()
    kubelet.wait_for_registration(GPU, count=2, timeout=DEADLINE_S)
    assert plugin.alive() and "Traceback" not in plugin.log()
    assert plugin.log().count("Not a directory") == 1, "said once, not once per retry"


def _bind(source: Path, target: Path, *options: str) -> bool:
    done = subprocess.run(["mount", "--bind", *options, str(source), str(target)], capture_output=True)
    return done.returncode == 0


def bind_read_only(path: Path) -> bool:
    """Mount `path` read-only over itself (root only); whether that worked."""
    return _bind(path, path, "-o", "ro")


def test_read_only_directory_while_the_kubelet_restarts(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN)")
    port = free_port()
    plugin = start_plugin(
        sock_dir, "sim:pcie-4", log_path=tmp_path / "plugin.log", metrics_address=f"127.0.0.1:{port}"
    )
    processes.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    plugin.send(signal.SIGSTOP)  # the restart and the remount land between two of its looks
    try:
        kubelet.restart()  # our socket removed, a new kubelet.sock
        if not bind_read_only(sock_dir):
            pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN)")
    finally:
        plugin.send(signal.SIGCONT)
    try:
        wait_until(lambda: "cannot listen" in plugin.log(), timeout=10, what="the cannot-listen line")
        line = next(li for li in plugin.log().splitlines() if "cannot listen" in li)
        assert "plugin server cannot listen; retrying" in line and "Read-only file system" in line
        status, body = wait_until(
            lambda: (r := http_get(port, "/readyz"))[0] == 503 and "Read-only" in r[1] and r,
            timeout=10,
            what="/readyz saying why",
        )
        why = f"cannot listen on {sock_dir / SOCKET}: Read-only file system"
        assert body == f"not registered: {GPU} ({why})\n"
        assert plugin.alive()
    finally:
        subprocess.run(["umount", str(sock_dir)], check=True)
    kubelet.wait_for_registration(GPU, count=2, timeout=DEADLINE_S)
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, timeout=10, what="ready again")
    assert plugin.log().count("plugin server cannot listen") == 1, "said once, not once per retry"
    assert "plugin server listening again" in plugin.log() and "Traceback" not in plugin.log()


def test_a_mount_of_a_removed_directory_fails_healthz(
    sock_dir: Path, other_dir: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """In a pod the kubelet directory is a hostPath mount: removed on the host, the container keeps
    the removed directory and never sees the new one. Only a restart helps: /healthz says so."""
    mounted = sock_dir / "device-plugins"
    mounted.mkdir()
    if os.geteuid() != 0 or not _bind(other_dir, mounted):
        pytest.skip("needs a bind mount (root with CAP_SYS_ADMIN)")
    port = free_port()
    plugin: Process | None = None
    try:
        with Kubelet(mounted) as kubelet:
            plugin = start_plugin(
                mounted, "sim:pcie-4", log_path=tmp_path / "plugin.log", metrics_address=f"127.0.0.1:{port}"
            )
            processes.append(plugin)
            settled(plugin, kubelet)
            assert http_get(port, "/healthz") == (200, "ok\n")
        shutil.rmtree(other_dir)  # on the "host"
        status, body = wait_until(
            lambda: (r := http_get(port, "/healthz"))[0] == 503 and r, timeout=10, what="/healthz failing"
        )
        assert "kubelet directory unusable" in body and "restart the container to mount the new one" in body
        assert plugin.alive() and plugin.log().count("this mount of it is stale") == 1
    finally:
        if plugin is not None:
            plugin.stop()  # its sockets keep the mount busy
        subprocess.run(["umount", str(mounted)], check=True)
