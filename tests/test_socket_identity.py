"""A plugin socket is made owner-only by bind() itself, under any umask, and never chmod-ed after: a
chmod changes the file's ctime, which the kubelet stand-in (and the plugin, for its own socket) took
for a new socket (a deregistration and a registration again, 1 run in 20). The stand-in's plugin
watcher keys a socket on what bind() sets, so a plugin that does chmod its socket registers once."""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api.dra import PLUGIN_TYPE, registration
from nvdp.node.gpus.resources import build_resources
from nvdp.node.nvml.sim import open_sim
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import DevicePluginServer
from nvdp.plugins.kubeletplugin.socket_server import UnixSocketServer
from nvdp.sim.kubelet.plugin_watcher import PluginWatcher

IN_ATTRIB = 0x4
IN_NONBLOCK = 0o4000
EVENT = struct.Struct("iIII")


def attribute_changes(directory: Path) -> Callable[[], list[str]]:
    """Watch `directory` for attribute changes (chmod, chown); the returned call reads the names."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    assert fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(directory), IN_ATTRIB) >= 0

    def names() -> list[str]:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            data = b""
        finally:
            os.close(fd)
        found, offset = [], 0
        while offset < len(data):
            _, _, _, length = EVENT.unpack_from(data, offset)
            start = offset + EVENT.size
            found.append(data[start : start + length].rstrip(b"\0").decode())
            offset = start + length
        return found

    return names


def device_plugin_server(path: Path, executor: ThreadPoolExecutor) -> Any:
    nvml = open_sim("pcie-4")
    nvml.init()
    (resource,) = build_resources(nvml.gpus()).resources
    return DevicePluginServer(resource, path, ResponseOptions(), executor)


def dra_server(path: Path, executor: ThreadPoolExecutor) -> Any:
    return UnixSocketServer(path, lambda server: None, executor)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


@pytest.mark.parametrize("make", [device_plugin_server, dra_server], ids=["device-plugin", "dra"])
def test_the_socket_is_owner_only_from_bind_without_a_chmod(
    open_umask: None, tmp_path: Path, executor: ThreadPoolExecutor, make: Callable[..., Any]
) -> None:
    read_changes = attribute_changes(tmp_path)
    server = make(tmp_path / "plugin.sock", executor)
    server.start()
    try:
        assert oct(stat.S_IMODE(os.stat(tmp_path / "plugin.sock").st_mode)) == oct(0o600)
        assert read_changes() == []
        assert os.umask(0) == 0, "the umask is put back"
    finally:
        server.stop(0)


class ChmodOnGetInfo:
    """A DRA plugin's Registration service that chmods its own socket while it is asked."""

    def __init__(self, socket: Path, name: str) -> None:
        self.socket, self.name = socket, name

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        os.chmod(self.socket, 0o600)
        return registration.pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.name, endpoint="/dra.sock", supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return registration.pb.RegistrationStatusResponse()


def serve(socket: Path, name: str, executor: ThreadPoolExecutor) -> grpc.Server:
    server = grpc.server(executor)
    registration.grpc.add_RegistrationServicer_to_server(ChmodOnGetInfo(socket, name), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def test_a_plugin_that_chmods_its_socket_registers_once(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    watcher = PluginWatcher(tmp_path)
    servers = [serve(tmp_path / "first.sock", "first.example.com", executor)]
    watcher.start()
    try:
        watcher.wait_for_registration("first.example.com", 10)
        # A second socket makes the watcher read the directory again, the first one's file included.
        servers.append(serve(tmp_path / "second.sock", "second.example.com", executor))
        watcher.wait_for_registration("second.example.com", 10)
    finally:
        watcher.stop()  # the scan under way ends first
        for server in servers:
            server.stop(None)
    assert [r.driver for r in watcher.registrations] == ["first.example.com", "second.example.com"]
