"""The kubelet's plugin watcher for DRA plugins (tests, `nvdp simulate --api dra`, benchmarks): it
watches a `plugins_registry` directory (inotify) and dials each socket that appears for GetInfo.

- A DRAPlugin naming an absolute endpoint and a DRAPlugin service this kubelet speaks is registered
  with the newest such service and the newest DRAResourceHealth it names, and told so
  (NotifyRegistrationStatus); anything else is told why not.
- A socket not answering GetInfo yet is asked again every RETRY_S, as the kubelet's reconciler does.
- A socket removed or replaced deregisters its plugin; a chmod of it does not.
- `restart()`: everything is forgotten and the directory read again; every plugin there re-registers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from nvdp.api.dra import DRA_PLUGIN, PLUGIN_TYPE, RESOURCE_HEALTH, registration
from nvdp.base.dir_watch import DirWatcher

log = logging.getLogger(__name__)

RETRY_S = 0.1

SocketId = tuple[int, int]  # socket_id(): inode number, modification time


class DraRegistration(NamedTuple):
    driver: str
    endpoint: str
    service: str  # the DRAPlugin service chosen, e.g. "v1.DRAPlugin"
    health_service: str  # "" when the plugin serves none this kubelet speaks
    registration_socket: str
    time: float  # time.monotonic() when registered


class PluginWatcher:
    """`start()` / `stop()` / `restart()`; `registrations` accumulate across restarts, `plugins` are
    the registered ones now (by driver name); `refusals` the (socket, error) told to plugins."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        dra_services: Sequence[str] = tuple(DRA_PLUGIN),
        health_services: Sequence[str] = tuple(RESOURCE_HEALTH),
        rpc_timeout: float = 5.0,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.dra_services = tuple(dra_services)  # newest first
        self.health_services = tuple(health_services)
        self.rpc_timeout = rpc_timeout
        self.registrations: list[DraRegistration] = []
        self.refusals: list[tuple[str, str]] = []
        self.plugins: dict[str, DraRegistration] = {}
        self._seen: dict[str, SocketId | None] = {}  # socket path -> the file registered from it
        self._cond = threading.Condition()
        self._watcher: DirWatcher | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._stopping = False
        self._watcher = DirWatcher(self.registry_dir)
        self._thread = threading.Thread(target=self._run, name="kubelet-plugin-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        watcher, thread = self._watcher, self._thread
        if watcher is not None:
            watcher.wake()
        if thread is not None:
            thread.join(5.0)
        if watcher is not None:
            watcher.close()
        self._watcher = self._thread = None
        with self._cond:
            self.plugins.clear()
            self._seen.clear()
            self._cond.notify_all()

    def restart(self) -> None:
        log.info("kubelet plugin watcher restarting dir=%s", self.registry_dir)
        self.stop()
        self.start()

    def wait_for_registration(self, driver: str, timeout: float, after: int = 0) -> DraRegistration:
        """The first registration of `driver` beyond the first `after` registrations of it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [r for r in self.registrations if r.driver == driver]
                if len(found) > after:
                    return found[after]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no registration {after + 1} of {driver} within {timeout}s")
                self._cond.wait(left)

    def _run(self) -> None:
        assert self._watcher is not None
        while not self._stopping:
            unanswered = self._scan()
            self._watcher.wait(RETRY_S if unanswered else None)

    def _scan(self) -> bool:
        """Register new sockets, deregister gone ones; True when a socket did not answer."""
        present = {str(p): socket_id(p) for p in self.registry_dir.glob("*.sock")}
        with self._cond:
            gone = [path for path, fid in self._seen.items() if present.get(path) != fid]
            for path in gone:
                del self._seen[path]
                for driver, plugin in list(self.plugins.items()):
                    if plugin.registration_socket == path:
                        log.info("DRA plugin deregistered driver=%s socket=%s", driver, path)
                        del self.plugins[driver]
        unanswered = False
        for path, fid in present.items():
            if path not in self._seen and fid is not None:
                if self._register(path):
                    self._seen[path] = fid
                else:
                    unanswered = True
        return unanswered

    def _register(self, path: str) -> bool:
        """Ask the plugin at `path` and register it (or tell it why not); False when it did not answer."""
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = registration.grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(registration.pb.InfoRequest(), timeout=self.rpc_timeout)
            except grpc.RpcError as error:
                log.info("plugin socket not answering GetInfo socket=%s error=%s", path, error.code().name)
                return False
            problem = self._problem(info)
            try:
                stub.NotifyRegistrationStatus(
                    registration.pb.RegistrationStatus(plugin_registered=not problem, error=problem),
                    timeout=self.rpc_timeout,
                )
            except grpc.RpcError as error:
                log.info("NotifyRegistrationStatus failed socket=%s error=%s", path, error.code().name)
        with self._cond:
            if problem:
                self.refusals.append((path, problem))
            else:
                versions = list(info.supported_versions)
                service = next(s for s in self.dra_services if s in versions)
                health = next((s for s in self.health_services if s in versions), "")
                found = DraRegistration(info.name, info.endpoint, service, health, path, time.monotonic())
                self.plugins[info.name] = found
                self.registrations.append(found)
                log.info(
                    "DRA plugin registered driver=%s endpoint=%s service=%s",
                    info.name,
                    info.endpoint,
                    service,
                )
            self._cond.notify_all()
        return True

    def _problem(self, info: Any) -> str:
        if info.type != PLUGIN_TYPE:
            return f"plugin type {info.type!r} is not {PLUGIN_TYPE}"
        if not info.name:
            return "empty DRA driver name"
        if not info.endpoint.startswith("/"):
            return f"DRA plugin endpoint {info.endpoint!r} must be an absolute path"
        if not any(s in info.supported_versions for s in self.dra_services):
            offered = list(info.supported_versions)
            return f"none of the services {offered} is one of {list(self.dra_services)}"
        return ""


def socket_id(path: Path) -> SocketId | None:
    """The socket file at `path` as made: inode number and modification time (set by bind(); a chmod
    changes the change time only, and the kubelet, which follows creations and removals, ignores a
    chmod too). None when nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)
