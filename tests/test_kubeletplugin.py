"""The kubelet-plugin shell both plugins stand on (`nvdp.plugins.kubeletplugin`), on real unix sockets: a
stale socket is replaced, a foreign one refused and never removed, the socket is 0600 from bind without a
chmod, a bind that fails says why, one server serves several sockets (all of them or none), a removed
socket is served again, a server that cannot listen holds back the ones after it, and wakes asked
before the loop sleeps are not lost."""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from nvdp.api.dra import registration
from nvdp.base.dir_watch import DirWatcher, file_id
from nvdp.base.errors import NvdpError
from nvdp.plugins.kubeletplugin.registration import RegistrationService
from nvdp.plugins.kubeletplugin.serve_loop import ServeLoop
from nvdp.plugins.kubeletplugin.socket_server import UnixSocketServer
from tests.readings import log_lines
from tests.test_socket_identity import attribute_changes, executor

__all__ = ["executor"]  # the fixture, shared with the socket-identity tests


def registration_server(path: Path, executor: ThreadPoolExecutor) -> UnixSocketServer:
    """A server that answers GetInfo, so that a test can tell it serves."""
    service = RegistrationService("DRAPlugin", "test.example.com", Path("/dra.sock"), ["v1.DRAPlugin"])
    return UnixSocketServer(path, service.add_to, executor)


def plugin_name(path: Path) -> str:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        info = registration.grpc.RegistrationStub(channel).GetInfo(registration.pb.InfoRequest(), timeout=5)
    return str(info.name)


def bound(path: Path, *, listening: bool) -> socket.socket:
    """A socket file at `path` of another process (listening) or of a killed one (not listening)."""
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    if listening:
        other.listen()
    return other


def test_a_stale_socket_is_replaced_and_said(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plugin.sock"
    bound(path, listening=False).close()  # a killed run's file: nothing listens on it
    server = registration_server(path, executor)
    with caplog.at_level(logging.INFO, logger="nvdp.plugins.kubeletplugin.socket_server"):
        server.start()
    try:
        assert log_lines(caplog) == [f"removed stale socket path={path}"]
        assert server.socket_is_ours() and plugin_name(path) == "test.example.com"
    finally:
        server.stop(0)
    assert not path.exists()


def test_a_foreign_socket_is_refused_and_left_alone(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    path = tmp_path / "plugin.sock"
    other = bound(path, listening=True)
    theirs = file_id(path)
    server = registration_server(path, executor)
    with pytest.raises(NvdpError) as refused:
        server.start()
    assert str(refused.value) == f"cannot listen on {path}: another process serves this socket"
    assert file_id(path) == theirs and not server.serving
    other.close()  # it went away: the next start takes the path
    server.start()
    try:
        assert server.socket_is_ours() and plugin_name(path) == "test.example.com"
    finally:
        server.stop(0)


def test_a_replaced_socket_is_not_ours_and_abandon_leaves_it(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """(A stop still loses it: gRPC's listener unlinks its path when it closes.)"""
    path = tmp_path / "plugin.sock"
    server = registration_server(path, executor)
    server.start()
    try:
        path.unlink()
        with bound(path, listening=True):
            theirs = file_id(path)
            assert not server.socket_is_ours()
            server.abandon()
            assert file_id(path) == theirs
    finally:
        server.stop(0)


def test_a_umask_changed_meanwhile_is_refused_without_a_chmod(
    open_umask: None, tmp_path: Path, executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread sets a umask between the server's umask and its bind: the socket is not served
    with a mode it did not choose, and it is not chmod-ed (its ctime is its identity)."""
    real_umask = os.umask
    calls: list[int] = []

    def other_thread_meanwhile(mask: int) -> int:
        calls.append(mask)
        old = real_umask(mask)
        if len(calls) == 1:
            real_umask(0o022)
        return old

    monkeypatch.setattr(os, "umask", other_thread_meanwhile)
    read_changes = attribute_changes(tmp_path)
    path = tmp_path / "plugin.sock"
    server = registration_server(path, executor)
    with pytest.raises(NvdpError) as refused:
        server.start()
    assert str(refused.value) == f"cannot listen on {path}: bound with mode 755, not 600 (the umask changed)"
    assert not path.exists() and not server.serving and read_changes() == []


def test_a_bind_that_fails_says_why(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    path = tmp_path / ("x" * 120) / "plugin.sock"
    path.parent.mkdir()
    server = registration_server(path, executor)
    with pytest.raises(NvdpError) as failed:
        server.start()
    assert str(failed.value) == f"cannot listen on {path}: AF_UNIX path too long"
    assert not server.serving


def test_a_missing_directory_is_made_when_asked(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    path = tmp_path / "plugins" / "gpu.nvidia.com" / "dra.sock"
    server = UnixSocketServer(path, lambda grpc_server: None, executor, make_parent=True)
    server.start()
    try:
        assert server.socket_is_ours() and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
    finally:
        server.stop(0)


def serve_threads() -> int:
    """gRPC's serving threads in this process: one per started grpc.Server, each waking every 200 ms."""
    return sum(1 for t in threading.enumerate() if t.name.endswith("(_serve)"))


def test_one_grpc_server_serves_several_sockets(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    first, second = tmp_path / "dra.sock", tmp_path / "reg" / "reg.sock"
    service = RegistrationService("DRAPlugin", "test.example.com", first, ["v1.DRAPlugin"])
    server = UnixSocketServer(first, service.add_to, executor, make_parent=True, also=[second])
    threads = serve_threads()
    loop = ServeLoop()
    sockets = [("dra", server)]
    try:
        assert loop.keep_serving(sockets, lambda name, s: s) == ["dra"]
        assert serve_threads() == threads + 1
        assert plugin_name(first) == plugin_name(second) == "test.example.com"
        assert {stat.S_IMODE(os.stat(p).st_mode) for p in (first, second)} == {0o600}
        second.unlink()
        assert not server.socket_is_ours() and server.unserved() == [second]

        def serve_again(name: str, old: UnixSocketServer) -> UnixSocketServer:
            old.stop(0)
            return old

        assert loop.keep_serving(sockets, serve_again) == ["dra"]  # both served again
        assert server.socket_is_ours() and plugin_name(second) == "test.example.com"
    finally:
        server.stop(0)
    assert not first.exists() and not second.exists() and server.unserved() == [first, second]


def test_a_later_socket_that_cannot_listen_leaves_none_served(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    first, second = tmp_path / "dra.sock", tmp_path / "reg.sock"
    server = UnixSocketServer(first, lambda grpc_server: None, executor, also=[second])
    with bound(second, listening=True):
        with pytest.raises(NvdpError) as refused:
            server.start()
    assert str(refused.value) == f"cannot listen on {second}: another process serves this socket"
    assert not server.serving and not first.exists()


# ---- the loop's skeleton ----------------------------------------------------------------------------


def test_a_removed_socket_is_served_again(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    loop = ServeLoop()
    path = tmp_path / "plugin.sock"
    server = registration_server(path, executor)
    removed: list[str] = []

    def serve_again(name: str, old: UnixSocketServer) -> UnixSocketServer:
        removed.append(name)
        old.stop(0)
        return old

    sockets = [("plugin", server)]
    try:
        assert loop.keep_serving(sockets, serve_again) == ["plugin"]  # never served: started
        assert loop.keep_serving(sockets, serve_again) == []  # ours: left alone
        path.unlink()  # a kubelet restart wipes the directory
        assert loop.keep_serving(sockets, serve_again) == ["plugin"]
        assert removed == ["plugin", "plugin"] and server.socket_is_ours()
        assert plugin_name(path) == "test.example.com"
    finally:
        server.stop(0)


def test_a_server_that_cannot_listen_holds_back_the_next_and_is_retried(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    now = [0.0]
    loop = ServeLoop(clock=lambda: now[0])
    first = registration_server(tmp_path / "first.sock", executor)
    second = registration_server(tmp_path / "second.sock", executor)
    other = bound(tmp_path / "first.sock", listening=True)
    sockets = [("first", first), ("second", second)]
    try:
        assert loop.keep_serving(sockets, lambda name, s: s, in_order=True) == []
        assert not second.serving and list(loop.listen.failing) == ["first"]
        other.close()
        assert loop.keep_serving(sockets, lambda name, s: s, in_order=True) == []  # not due yet
        now[0] += loop.listen.retry_in() or 0.0
        assert loop.keep_serving(sockets, lambda name, s: s, in_order=True) == ["first", "second"]
        assert loop.listen.failing == {}
    finally:
        first.stop(0)
        second.stop(0)


def test_wakes_asked_before_the_watch_are_kept(tmp_path: Path) -> None:
    loop = ServeLoop()
    assert loop.wake("reload") and not loop.wake("reload")  # pending already
    watcher = DirWatcher(tmp_path)
    try:
        loop.attach(watcher)
        assert loop.wait(10.0) == {"reload"}  # no sleep: the wake came before the watch
        loop.waker("rescan")()
        assert loop.wait(10.0) == {"rescan"}
    finally:
        watcher.close()
