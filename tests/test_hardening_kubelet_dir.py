"""Issue 9 hardening of the kubelet directory: one instance per directory (a lock), owner-only
sockets and lock whatever the umask, and a read-only directory said in one line and retried."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from nvdp.base.dir_watch import file_id
from nvdp.base.errors import DirLockHeld
from nvdp.plugins.deviceplugin.supervisor import Supervisor
from nvdp.plugins.deviceplugin.types import DaemonSettings
from nvdp.plugins.kubeletplugin.dir_lock import LOCK_NAME, DirClaim
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.test_supervisor import Rig

GPU = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sockets_and_lock_are_owner_only_under_umask_000(
    open_umask: None, sock_dir: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    plugin = start_plugin(sock_dir, "sim:pcie-4")
    processes.append(plugin)
    kubelet.wait_for_registration(GPU, timeout=20)
    assert oct(mode(sock_dir / SOCKET)) == oct(0o600)
    assert oct(mode(sock_dir / LOCK_NAME)) == oct(0o600)
    assert (sock_dir / LOCK_NAME).read_text() == f"pid={plugin.pid}\n"


def test_second_instance_exits_1_naming_the_holder(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    first = start_plugin(sock_dir, "sim:pcie-4")
    processes.append(first)
    kubelet.wait_for_registration(GPU, timeout=20)
    socket_before = file_id(sock_dir / SOCKET)
    second = start_plugin(sock_dir, "sim:pcie-4", log_path=tmp_path / "second.log")
    processes.append(second)
    assert second.wait(20) == 1
    errors = [li for li in second.log().splitlines() if "exiting" in li]
    assert len(errors) == 1 and "Traceback" not in second.log()
    assert f"is in use by another nvdp (lock {sock_dir / LOCK_NAME} held by pid={first.pid})" in errors[0]
    assert file_id(sock_dir / SOCKET) == socket_before, "the first instance's socket is untouched"
    assert first.alive()


def test_second_instance_waits_and_takes_over(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    first = start_plugin(sock_dir, "sim:pcie-4")
    processes.append(first)
    kubelet.wait_for_registration(GPU, timeout=20)
    socket_before = file_id(sock_dir / SOCKET)
    second = start_plugin(
        sock_dir, "sim:pcie-4", log_path=tmp_path / "second.log", extra=["--fail-on-init-error=false"]
    )
    processes.append(second)
    wait_until(lambda: "in use by another instance" in second.log(), timeout=20, what="waiting line")
    assert f"pid={first.pid}" in second.log().splitlines()[-1]
    assert file_id(sock_dir / SOCKET) == socket_before and len(kubelet.registrations) == 1
    assert first.stop() == 0
    kubelet.wait_for_registration(GPU, count=2, timeout=20)
    assert (sock_dir / LOCK_NAME).read_text() == f"pid={second.pid}\n"


def test_claim_waits_until_stopped_and_relocks_a_removed_lock_file(tmp_path: Path) -> None:
    holder = DirClaim(tmp_path, fail_if_held=True)
    assert holder.acquire(threading.Event())
    with pytest.raises(DirLockHeld):
        DirClaim(tmp_path, fail_if_held=True).acquire(threading.Event())
    stop = threading.Event()
    stop.set()
    assert not DirClaim(tmp_path, fail_if_held=False).acquire(stop)
    (tmp_path / LOCK_NAME).unlink()  # a kubelet restart empties the directory
    wait_until(lambda: holder.refresh() is None, timeout=5, what="the lock taken again")
    assert (tmp_path / LOCK_NAME).read_text() == f"pid={os.getpid()}\n"
    with pytest.raises(DirLockHeld):
        DirClaim(tmp_path, fail_if_held=True).acquire(threading.Event())
    holder.release()
    assert not (tmp_path / LOCK_NAME).exists()


def _bind_read_only(path: Path) -> bool:
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True)
    return done.returncode == 0


def test_read_only_kubelet_dir_is_one_line_and_retried(
    sock_dir: Path, tmp_path: Path, kubelet: Kubelet, processes: list[Process]
) -> None:
    if os.geteuid() != 0 or not _bind_read_only(sock_dir):
        pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN)")
    try:
        plugin = start_plugin(sock_dir, "sim:pcie-4", log_path=tmp_path / "plugin.log")
        processes.append(plugin)
        wait_until(lambda: "kubelet directory unusable" in plugin.log(), timeout=20, what="the error line")
        line = next(li for li in plugin.log().splitlines() if "kubelet directory unusable" in li)
        assert "Read-only file system (EROFS)" in line and "Traceback" not in plugin.log()
        assert plugin.alive()
    finally:
        subprocess.run(["umount", str(sock_dir)], check=True)
    kubelet.wait_for_registration(GPU, timeout=20)
    assert plugin.log().count("kubelet directory unusable") == 1


# ---- the supervisor drives the claim through its seam ----------------------------------------


class FakeClaim:
    def __init__(self, acquired: bool = True) -> None:
        self.acquired = acquired
        self.calls: list[str] = []
        self.taken = False

    def acquire(self, stop: threading.Event) -> bool:
        self.calls.append("acquire")
        return self.acquired

    def refresh(self) -> None:
        self.calls.append("refresh")
        if self.taken:
            raise DirLockHeld("taken while the kubelet restarted")

    def release(self) -> None:
        self.calls.append("release")


def claimed_rig(tmp_path: Path, claim: FakeClaim) -> Rig:
    rig = Rig(tmp_path, DaemonSettings(kubelet_socket=tmp_path / "kubelet.sock"))
    old = rig.supervisor
    rig.supervisor = Supervisor(
        rig.nvml,
        old.settings,
        reload=rig._reload,
        make_server=old._make_server,
        host_facts=rig.facts,
        register=rig.kubelet.register,
        watcher=old._make_watcher,
        socket_id=lambda path: rig.kubelet.socket_id,
        dir_claim=claim,
    )
    return rig


def test_supervisor_claims_refreshes_and_releases(tmp_path: Path) -> None:
    claim = FakeClaim()
    rig = claimed_rig(tmp_path, claim).start()
    assert rig.supervisor.ready.wait(5)
    rig.stop()
    assert claim.calls[0] == "acquire" and claim.calls[-1] == "release" and "refresh" in claim.calls


def test_supervisor_serves_nothing_until_claimed(tmp_path: Path) -> None:
    claim = FakeClaim(acquired=False)  # stopped while waiting for the lock
    rig = claimed_rig(tmp_path, claim).start()
    rig.stop()
    assert claim.calls == ["acquire"] and rig.made == [] and rig.error is None


def test_supervisor_exits_when_the_directory_was_taken(tmp_path: Path) -> None:
    claim = FakeClaim()
    rig = claimed_rig(tmp_path, claim).start()
    assert rig.supervisor.ready.wait(5)
    claim.taken = True
    rig.poke()
    wait_until(lambda: rig.error is not None, timeout=5, what="the error")
    assert isinstance(rig.error, DirLockHeld) and claim.calls[-1] == "release"
    assert all(server.stopped for server in rig.made)
