"""Issue 17 case 7, the parts: the directory watch follows the path (re-created, replaced by a file or
a symlink, a symlink re-pointed, a parent removed), the lock is taken again in the new directory, a
server that cannot listen says why and can be started again, and the supervisor retries such a server
with backoff while the others serve."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from nvdp.api import pb, pb_grpc
from nvdp.base.dir_watch import DirWatcher
from nvdp.base.errors import DirLockHeld, NvdpError
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.gpus.resources import build_resources
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.sim import open_sim
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import DevicePluginServer
from nvdp.plugins.deviceplugin.supervisor import DaemonSettings
from nvdp.plugins.kubeletplugin.dir_lock import LOCK_NAME, DirClaim
from nvdp.plugins.kubeletplugin.listen_retry import RETRY_MAX_S, RETRY_MIN_S
from testkit import wait_until
from tests.fakes import FakeServer
from tests.readings import log_lines
from tests.test_kubelet_dir_replaced import bind_read_only
from tests.test_supervisor import GPU, Rig

CHANGE_S = 5.0  # a change wakes the watcher well within this
QUIET_S = 0.2  # nothing that matters happens: the wait runs out


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Path, DirWatcher]]:
    directory = tmp_path / "kubelet" / "device-plugins"
    directory.mkdir(parents=True)
    watcher = DirWatcher(directory)
    assert watcher.uses_inotify
    yield directory, watcher
    watcher.close()


def test_directory_removed_and_recreated(watched: tuple[Path, DirWatcher]) -> None:
    directory, watcher = watched
    shutil.rmtree(directory)
    assert watcher.wait(CHANGE_S)
    directory.mkdir()
    assert watcher.wait(CHANGE_S)
    (directory / "kubelet.sock").touch()  # in the new directory
    assert watcher.wait(CHANGE_S)
    assert not watcher.wait(QUIET_S)


def test_a_parent_removed_and_recreated(watched: tuple[Path, DirWatcher]) -> None:
    directory, watcher = watched
    shutil.rmtree(directory.parent)
    assert watcher.wait(CHANGE_S)
    directory.mkdir(parents=True)
    while watcher.wait(QUIET_S):  # one wake-up per level made, or fewer
        pass
    (directory / "kubelet.sock").touch()
    assert watcher.wait(CHANGE_S)


def test_replaced_by_a_file_then_a_directory(watched: tuple[Path, DirWatcher]) -> None:
    directory, watcher = watched
    shutil.rmtree(directory)
    directory.write_text("x")
    while watcher.wait(QUIET_S):
        pass
    directory.unlink()
    directory.mkdir()
    assert watcher.wait(CHANGE_S)
    (directory / "kubelet.sock").touch()
    assert watcher.wait(CHANGE_S)


def test_replaced_by_a_symlink_repointed_and_its_target_recreated(
    watched: tuple[Path, DirWatcher], tmp_path: Path
) -> None:
    directory, watcher = watched
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    shutil.rmtree(directory)
    directory.symlink_to(first)
    while watcher.wait(QUIET_S):
        pass
    (first / "kubelet.sock").touch()
    assert watcher.wait(CHANGE_S)
    swap = directory.parent / "swap"
    swap.symlink_to(second)
    os.replace(swap, directory)  # `ln -sfn`
    assert watcher.wait(CHANGE_S)
    (first / "other").touch()  # no longer what the path names
    assert not watcher.wait(QUIET_S)
    (second / "kubelet.sock").touch()
    assert watcher.wait(CHANGE_S)
    shutil.rmtree(second)  # the link's target goes and comes back
    assert watcher.wait(CHANGE_S)
    second.mkdir()
    assert watcher.wait(CHANGE_S)
    (second / "kubelet.sock").touch()
    assert watcher.wait(CHANGE_S)


def test_directory_removed_while_a_socket_is_bound_in_it(watched: tuple[Path, DirWatcher]) -> None:
    """The removed directory's IN_DELETE_SELF waits while a socket bound in it holds it (a plugin
    server that was not restarted yet): its parent reports the removal."""
    directory, watcher = watched
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(directory / "nvidia-gpu.sock"))
        bound.listen()
        shutil.rmtree(directory)
        while watcher.wait(QUIET_S):
            pass
        directory.mkdir()
        assert watcher.wait(CHANGE_S)
        (directory / "kubelet.sock").touch()
        assert watcher.wait(CHANGE_S)


def test_other_entries_of_the_parents_do_not_wake_it(watched: tuple[Path, DirWatcher]) -> None:
    directory, watcher = watched
    (directory.parent / "pod-resources").mkdir()
    (directory.parent.parent / "elsewhere").touch()
    assert not watcher.wait(QUIET_S)
    watcher.wake()
    assert not watcher.wait(CHANGE_S)  # woken, and no change seen


def test_an_added_parent_with_names_wakes_only_for_those_entries(watched: tuple[Path, DirWatcher]) -> None:
    directory, watcher = watched
    parent = directory.parent.parent  # e.g. /var/lib/kubelet, watched for plugins/ to appear
    assert watcher.add(parent, names=frozenset({"plugins"}))
    (parent / "other-traffic").mkdir()
    assert not watcher.wait(QUIET_S)
    (parent / "plugins").mkdir()
    assert watcher.wait(CHANGE_S)


# ---- the lock follows the path ------------------------------------------------------------------


def test_claim_is_taken_again_in_a_new_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "device-plugins"
    now = [0.0]
    claim = DirClaim(directory, fail_if_held=True, clock=lambda: now[0])

    def refresh_when_due() -> float | None:
        delay = claim.refresh()
        now[0] += delay or 0.0
        return delay

    assert claim.acquire(threading.Event())
    assert claim.refresh() is None and claim.problem is None
    shutil.rmtree(directory)
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.dir_lock"):
        assert refresh_when_due() == 0.05 and claim.problem is None  # not at once: rm -rf may be running
        delays = [refresh_when_due() for _ in range(3)]
        assert delays == [0.1, 0.2, 0.4]  # backoff while the directory is gone
        assert claim.problem is not None and "(ENOENT)" in claim.problem and not claim.stale_mount
        directory.mkdir()
        now[0] -= 0.1
        assert claim.refresh() == pytest.approx(0.1)  # not due yet: not tried
        now[0] += 0.1
        assert claim.refresh() is None and claim.problem is None
    assert [r.getMessage() for r in caplog.records] == [
        "kubelet directory unusable; retrying",  # once, not once per try
        "kubelet directory claimed",
    ]
    assert (directory / LOCK_NAME).read_text() == f"pid={os.getpid()}\n"
    with pytest.raises(DirLockHeld):
        DirClaim(directory, fail_if_held=True).acquire(threading.Event())
    claim.release()
    assert not (directory / LOCK_NAME).exists() and claim.refresh() is None


# ---- a server that cannot listen ----------------------------------------------------------------


def test_server_that_cannot_listen_says_why_and_starts_later(sock_dir: Path) -> None:
    if os.geteuid() != 0 or not bind_read_only(sock_dir):
        pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN)")
    nvml = open_sim("pcie-4")
    nvml.init()
    (resource,) = build_resources(nvml.gpus()).resources
    executor = ThreadPoolExecutor(max_workers=4)
    server = DevicePluginServer(resource, sock_dir / resource.socket_name, ResponseOptions(), executor)
    threads = threading.active_count()
    try:
        for _ in range(3):
            with pytest.raises(NvdpError) as failed:
                server.start()
            assert str(failed.value) == f"cannot listen on {server.socket_path}: Read-only file system"
        assert threading.active_count() <= threads, "nothing is left running"
        assert not server.socket_is_ours()
    finally:
        subprocess.run(["umount", str(sock_dir)], check=True)
    try:
        server.start()
        assert server.socket_is_ours()
        with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            assert stub.GetDevicePluginOptions(pb.Empty(), timeout=5) is not None
    finally:
        server.stop(grace=0.0)
        executor.shutdown(wait=False, cancel_futures=True)
        nvml.shutdown()


class FailingServer(FakeServer):
    """A fake server whose socket cannot be made for the first `plan[resource]` starts."""

    plan: dict[str, int] = {}

    def start(self) -> None:
        if self.plan.get(self.resource_name, 0) > 0:
            self.plan[self.resource_name] -= 1
            raise NvdpError(f"cannot listen on {self.socket_path}: Read-only file system")
        super().start()


def test_supervisor_retries_a_server_that_cannot_listen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    FailingServer.plan = {GPU: 5}
    rig = Rig(tmp_path, DaemonSettings(kubelet_socket=tmp_path / "kubelet.sock"), server_type=FailingServer)
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.listen_retry"):
        rig.start()
        try:
            assert rig.supervisor.ready.wait(10), "registered once it listens"
            assert rig.error is None and rig.kubelet.registered() == [GPU]
            (server,) = rig.made  # the same server, started again
            assert server.started and FailingServer.plan == {GPU: 0}
            timers = rig.watchers[0].timeouts
            backoff = [t for t in timers if t is not None]
            assert len(backoff) >= 5 and backoff[0] <= RETRY_MIN_S and max(backoff) <= RETRY_MAX_S
            assert backoff[4] > backoff[0] * 4, "the retries back off"
            wait_until(lambda: timers[-1] is None, timeout=5, what="no timer once it listens")
        finally:
            rig.stop()
    assert log_lines(caplog) == [
        f"plugin server cannot listen; retrying resource={GPU} "
        f'error="cannot listen on {tmp_path / "nvidia-gpu.sock"}: Read-only file system"',
        f"plugin server listening again resource={GPU}",
    ]


def test_other_resources_serve_while_one_cannot_listen(tmp_path: Path) -> None:
    failing = "nvidia.com/mig-1g.5gb"
    FailingServer.plan = {failing: 1_000_000}
    settings = DaemonSettings(
        kubelet_socket=tmp_path / "kubelet.sock", rules=ResourceRules(mig_strategy="mixed")
    )
    rig = Rig(tmp_path, settings, nvml=open_nvml("sim:dgx-a100-mig"), server_type=FailingServer)
    rig.start()
    try:
        wait_until(lambda: len(rig.kubelet.registered()) == len(rig.made) - 1, 5, "the others registered")
        assert failing not in rig.kubelet.registered() and rig.error is None
        assert not rig.supervisor.ready.is_set()
        registrations = rig.supervisor.registrations()
        assert [name for name, ok in registrations.items() if not ok] == [failing]
        why = f"cannot listen on {tmp_path / 'nvidia-mig-1g.5gb.sock'}: Read-only file system"
        assert rig.supervisor.registration_problems() == {failing: why}
        FailingServer.plan = {}  # the directory is fixed
        assert rig.supervisor.ready.wait(10)
        assert sorted(rig.kubelet.registered()) == sorted(registrations)
        assert rig.supervisor.registration_problems() == {}
    finally:
        rig.stop()
