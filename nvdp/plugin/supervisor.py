"""The daemon's main loop: NVML, resources, one server per resource, kubelet registration,
restart detection and SIGHUP reloads.

The supervisor runs on the main thread and sleeps in `DirWatcher.wait`: it wakes only when the
kubelet's directory changes, a signal arrives, or a registration retry is due.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from nvdp.errors import NvdpError, RegistrationError
from nvdp.health.types import HealthSettings
from nvdp.logs import log_event
from nvdp.mps.ready import MpsReadiness
from nvdp.nvml.types import GpuInfo, Nvml
from nvdp.plugin.registration import register
from nvdp.plugin.responses import ResponseOptions, present_control_devices
from nvdp.plugin.server import DevicePluginServer, PreferredAllocator, RpcObserver
from nvdp.plugin.watch import DirWatcher, FileId, file_id
from nvdp.resources import (
    NamePattern,
    Replication,
    Resource,
    ResourceError,
    build_resources,
    parse_mig_minors,
)

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 2.0
# procfs shows the host kernel's driver state inside the container too.
MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
RETRY_MIN_S = 0.05
RETRY_MAX_S = 5.0


@dataclass(frozen=True)
class DaemonSettings:
    """What the supervisor needs from the resolved configuration."""

    kubelet_socket: Path
    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    dev_root: str = "/"  # the host's root for /dev/nvidia* (device-spec host paths)
    container_driver_root: str = "/driver-root"  # where the chart mounts the driver root in our container
    gpu_patterns: tuple[NamePattern, ...] = ()
    mig_patterns: tuple[NamePattern, ...] = ()
    sharing: tuple[Replication, ...] = ()
    response: ResponseOptions = field(default_factory=ResponseOptions)
    health: HealthSettings | None = None  # passed through to HealthHooks.start


class AllocatorFactory(Protocol):
    def __call__(self, resource: Resource, gpus: Sequence[GpuInfo]) -> PreferredAllocator | None: ...


class HealthHooks(Protocol):
    """The health subsystem as the supervisor sees it (nvdp.health provides it)."""

    def start(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None) -> None:
        """Start monitoring, or on a reload take the new enumeration and settings."""
        ...

    def set_targets(self, servers: Sequence[DevicePluginServer]) -> None: ...
    def stop(self) -> None: ...


class StatusObserver(RpcObserver, Protocol):
    """Receives lifecycle facts and every RPC's outcome (metrics, readiness)."""

    def registered(self, resource: str, first: bool) -> None: ...
    def servers_changed(self, servers: Mapping[str, DevicePluginServer]) -> None: ...
    def kubelet_lost(self) -> None: ...
    def reloaded(self, ok: bool) -> None: ...


class InitError(NvdpError):
    """NVML could not be initialised and fail-on-init-error is set."""


class Supervisor:
    def __init__(
        self,
        nvml: Nvml,
        load_settings: Callable[[], DaemonSettings],
        *,
        allocator_factory: AllocatorFactory | None = None,
        health: HealthHooks | None = None,
        observer: StatusObserver | None = None,
    ) -> None:
        self._nvml = nvml
        self._load_settings = load_settings
        self._allocator_factory = allocator_factory
        self._health = health
        self._observer = observer
        self.settings = load_settings()
        self.plugin_dir = self.settings.kubelet_socket.parent
        self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="grpc")
        self.servers: dict[str, DevicePluginServer] = {}
        self._registered_at: dict[str, FileId | None] = {}  # resource -> kubelet.sock registered with
        self._ever_registered: set[str] = set()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._watcher: DirWatcher | None = None
        self._nvml_ok = False
        self.ready = threading.Event()  # set once every resource is registered
        self.gpus: list[GpuInfo] = []
        self._mps = MpsReadiness()  # MPS resources only while their control daemon is ready

    # ---- requests from signal handlers / other threads ----------------------------------------
    def request_stop(self) -> None:
        self._stop.set()
        if self._watcher:
            self._watcher.wake()

    def request_reload(self) -> None:
        self._reload.set()
        if self._watcher:
            self._watcher.wake()

    # ---- main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until request_stop(). Raises InitError when NVML fails and fail-on-init-error."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._watcher = DirWatcher(self.plugin_dir)
        try:
            self._start_nvml()
            if self._nvml_ok:
                self._initial_apply()
            retry_in: float | None = None
            while not self._stop.is_set():
                if self._reload.is_set():
                    self._reload.clear()
                    self._do_reload()
                elif self._nvml_ok and self._mps.changed(self._watcher):
                    self._mps_changed()
                retry_in = self._sync_registrations(retry_in)
                if self._stop.is_set():
                    break
                self._watcher.wait(retry_in)
        finally:
            self._shutdown()

    def _start_nvml(self) -> None:
        try:
            self._nvml.init()
        except NvdpError as error:
            self._init_failed("failed to initialize NVML", error)
            return
        self._nvml_ok = True
        log_event(
            log,
            logging.INFO,
            "NVML initialized",
            driver=self._nvml.driver_version(),
            cuda=self._nvml.cuda_driver_version(),
        )

    def _shutdown(self) -> None:
        if self._health is not None:
            self._health.stop()
        for server in self.servers.values():
            server.stop(grace=0.2)
        self.servers.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._watcher is not None:
            self._watcher.close()
        if self._nvml_ok:
            self._nvml.shutdown()
        log_event(log, logging.INFO, "stopped")

    # ---- resources and servers ----------------------------------------------------------------
    def _build(self, settings: DaemonSettings) -> list[Resource]:
        self.gpus = self._nvml.gpus()
        minors = None
        if any(g.mig_enabled for g in self.gpus):
            try:
                minors = parse_mig_minors(MIG_MINORS_FILE.read_text())
            except OSError:
                minors = None
        resources = build_resources(
            self.gpus,
            mig_strategy=settings.mig_strategy,
            gpu_patterns=settings.gpu_patterns,
            mig_patterns=settings.mig_patterns,
            sharing=settings.sharing,
            mig_minors=minors,
        )
        return self._mps.filter(resources, self.gpus, settings.response.mps_root)

    @staticmethod
    def _visible_dev_root(settings: DaemonSettings) -> str:
        """Where the host's device nodes can be seen from this process: the host root itself when
        it is "/" (or we run on the host), else the driver root mounted into the container."""
        if settings.dev_root not in ("", "/") and not os.path.isdir(settings.dev_root):
            if os.path.isdir(settings.container_driver_root):
                return settings.container_driver_root
        return settings.dev_root

    def _apply(self, settings: DaemonSettings) -> None:
        """Build resources and converge the running servers onto them (reload by diff)."""
        resources = self._build(settings)
        wanted = {r.name: r for r in resources}
        options = replace(
            settings.response, control_devices=present_control_devices(self._visible_dev_root(settings))
        )
        for name in list(self.servers):
            server = self.servers[name]
            new = wanted.get(name)
            if new is None or new.signature() != server.resource.signature() or server.options != options:
                server.stop(grace=0.2)
                del self.servers[name]
                self._registered_at.pop(name, None)
                log_event(
                    log,
                    logging.INFO,
                    "stopped plugin",
                    resource=name,
                    reason="removed" if new is None else "changed",
                )
        for name, resource in wanted.items():
            if name in self.servers:
                continue
            allocator = self._allocator_factory(resource, self.gpus) if self._allocator_factory else None
            server = DevicePluginServer(
                resource,
                self.plugin_dir / resource.socket_name,
                options,
                self._executor,
                allocator,
                self._observer,
            )
            server.start()
            self.servers[name] = server
            self._registered_at[name] = None
            log_event(
                log,
                logging.INFO,
                "serving",
                resource=name,
                devices=len(resource.devices),
                socket=str(server.socket_path),
                sharing=resource.sharing,
            )
        if not wanted:
            log_event(
                log,
                logging.WARNING,
                "no devices found on this node; waiting (send SIGHUP to rescan)",
                gpus=len(self.gpus),
            )
        self.ready.clear()
        if self._health is not None:
            self._health.start(self.gpus, settings.health)
            self._health.set_targets(list(self.servers.values()))
        if self._observer is not None:
            self._observer.servers_changed(dict(self.servers))

    def _initial_apply(self) -> None:
        """Serve the node's resources; when they cannot be built (e.g. a MIG layout the strategy
        refuses) exit with the error if fail-on-init-error, else say so and wait for a SIGHUP."""
        try:
            self._apply(self.settings)
        except ResourceError as error:
            self._init_failed("cannot serve this node's devices", error)

    def _init_failed(self, what: str, error: NvdpError) -> None:
        """NVIDIA's failOnInitError: exit with the reason, or say it once and idle until SIGHUP."""
        if self.settings.fail_on_init_error:
            raise InitError(f"{what}: {error}") from error
        log_event(
            log, logging.ERROR, f"{what}; idling until SIGHUP (fail-on-init-error=false)", error=str(error)
        )
        if self._observer is not None:
            self._observer.servers_changed({})  # idling on purpose: nothing to register

    def _do_reload(self) -> None:
        log_event(log, logging.INFO, "reloading configuration")
        try:
            settings = self._load_settings()
            if not self._nvml_ok:
                self._start_nvml()
            if self._nvml_ok:
                self._apply(settings)
        except NvdpError as error:
            log_event(
                log, logging.ERROR, "reload failed; keeping the previous configuration", error=str(error)
            )
            if self._observer is not None:
                self._observer.reloaded(False)
            return
        if settings.kubelet_socket != self.settings.kubelet_socket:
            log_event(
                log,
                logging.WARNING,
                "kubelet-socket changes take effect on restart",
                current=str(self.settings.kubelet_socket),
            )
            settings = replace(settings, kubelet_socket=self.settings.kubelet_socket)
        self.settings = settings
        log_event(log, logging.INFO, "reloaded", resources=",".join(sorted(self.servers)) or "none")
        if self._observer is not None:
            self._observer.reloaded(True)

    def _mps_changed(self) -> None:
        """An MPS ready marker came or went: serve or withdraw that resource (others untouched)."""
        try:
            self._apply(self.settings)
        except NvdpError as error:
            log_event(log, logging.ERROR, "cannot apply an MPS readiness change", error=str(error))

    # ---- registration -------------------------------------------------------------------------
    def _kubelet_socket_id(self) -> FileId | None:
        return file_id(self.settings.kubelet_socket)

    def _sync_registrations(self, previous_retry: float | None) -> float | None:
        """Restart servers whose socket was wiped and (re-)register where needed.

        Returns the delay before the next retry, or None when everything is registered.
        """
        kubelet_id = self._kubelet_socket_id()
        if kubelet_id is None:
            if any(v is not None for v in self._registered_at.values()):
                log_event(
                    log,
                    logging.WARNING,
                    "kubelet socket gone; waiting for the kubelet",
                    path=str(self.settings.kubelet_socket),
                )
                if self._observer is not None:
                    self._observer.kubelet_lost()
                self.ready.clear()
            for name in self._registered_at:
                self._registered_at[name] = None
            if not self.servers:
                self.ready.set()
            return None
        failed = False
        for name, server in self.servers.items():
            if not server.socket_is_ours():
                log_event(log, logging.INFO, "plugin socket removed; restarting server", resource=name)
                server.stop(grace=0.0)
                server = DevicePluginServer(
                    server.resource,
                    server.socket_path,
                    server.options,
                    self._executor,
                    server.allocator,
                    self._observer,
                )
                server.start()
                self.servers[name] = server
                self._registered_at[name] = None
                if self._health is not None:
                    self._health.set_targets(list(self.servers.values()))
                if self._observer is not None:
                    self._observer.servers_changed(dict(self.servers))
            if self._registered_at.get(name) == kubelet_id:
                continue
            started = time.monotonic()
            try:
                accepted_id = register(
                    self.settings.kubelet_socket,
                    name,
                    server.socket_path.name,
                    preferred_allocation=server.allocator_available,
                    timeout=REGISTER_TIMEOUT_S,
                )
            except RegistrationError as error:
                log_event(
                    log, logging.WARNING, "registration failed; will retry", resource=name, error=str(error)
                )
                failed = True
                continue
            first = name not in self._ever_registered
            self._ever_registered.add(name)
            self._registered_at[name] = accepted_id
            log_event(
                log,
                logging.INFO,
                "registered with kubelet" if first else "re-registered with kubelet",
                resource=name,
                endpoint=server.socket_path.name,
                ms=round((time.monotonic() - started) * 1000, 1),
            )
            if self._observer is not None:
                self._observer.registered(name, first)
        if failed:
            return min(RETRY_MAX_S, max(RETRY_MIN_S, (previous_retry or RETRY_MIN_S) * 2))
        # Ready also with nothing to serve (no GPUs, or NVML failed with fail-on-init-error=false):
        # a DaemonSet rollout must not stall on such a node; the logs and metrics say why.
        self.ready.set()
        return None
