"""The plugin's main loop: resources from NVML, one server per resource, reloads by diff, and when to
(re-)register with the kubelet (the registrations: `nvdp.plugins.deviceplugin.kubelet_link`).

- It runs on the main thread, asleep in its watcher's `wait`, woken by: the kubelet directory (or
  its path) changing, a stop or reload, a due retry (registration, listen, directory lock, CDI
  write), or a resource's ListAndWatch stream ending (register again).
- Node-fact directories (MPS markers, device nodes, CDI specs) join the watch; a change re-applies.
- Everything outside comes through seams (`nvdp.plugins.deviceplugin.types`), unit-tested with fakes.
- A reload reads one way: the loop calls its `reload()` source and converges onto the settings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Generic

from nvdp.base.dir_watch import DirWatcher, FileId, Watcher, call_aside, file_id
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import InitError, NvdpError
from nvdp.base.logs import log_event
from nvdp.node.gpus.resources import NodeResources, Resource
from nvdp.node.nvml.types import GpuInfo, Nvml
from nvdp.plugins.deviceplugin.converge import plan_servers
from nvdp.plugins.deviceplugin.kubelet_link import KubeletLink
from nvdp.plugins.deviceplugin.node_gates import NodeGates
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import PreferredAllocator
from nvdp.plugins.deviceplugin.types import (
    AllocatorFactory,
    DaemonSettings,
    DirClaimHooks,
    HealthHooks,
    HostFacts,
    MisfitSink,
    PluginServer,
    Registrar,
    S,
    ServerFactory,
    StatusObserver,
)
from nvdp.plugins.handoff import Handoff
from nvdp.plugins.kubeletplugin.registration import register
from nvdp.plugins.kubeletplugin.serve_loop import ServeLoop, sooner

__all__ = ["DaemonSettings", "InitError", "PluginServer", "StatusObserver", "Supervisor"]

log = logging.getLogger(__name__)


class Supervisor(Generic[S]):
    """Runs the node's plugin servers (of type S, built by `make_server`) until `request_stop()`.

    `settings` are the initial settings; `reload()` loads new ones when `request_reload()` asks.
    """

    def __init__(
        self,
        nvml: Nvml,
        settings: DaemonSettings,
        *,
        reload: Callable[[], DaemonSettings],
        make_server: ServerFactory[S],
        host_facts: HostFacts,
        register: Registrar = register,
        watcher: Callable[[Path], Watcher] = DirWatcher,
        socket_id: Callable[[Path], FileId | None] = file_id,
        allocator_factory: AllocatorFactory | None = None,
        health: HealthHooks | None = None,
        observer: StatusObserver[S] | None = None,
        dir_claim: DirClaimHooks | None = None,
        misfits: MisfitSink | None = None,
        handoff: Handoff | None = None,
        holds: Callable[[Sequence[GpuInfo], bool], Mapping[str, str] | None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._dir_claim = dir_claim
        self.settings = settings
        self._reload_source = reload
        self._make_server = make_server
        self._host_facts = host_facts
        self._make_watcher = watcher
        self._socket_id = socket_id
        self._allocator_factory = allocator_factory
        self._health = health
        self._observer = observer
        # node facts that withhold devices: MPS, device nodes, CDI, the GPUs the DRA driver serves
        self._gates = NodeGates(misfits, handoff, holds)
        self.plugin_dir = settings.kubelet_socket.parent
        self.servers: dict[str, S] = {}
        # wakes ("reload", "rescan": a device layout change to apply, "kubelet": the kubelet's stream
        # of a resource ended), the stop, and the servers that could not listen on their socket
        self._loop = ServeLoop()
        self._watcher: Watcher | None = None
        self._nvml_ok = False
        self.ready = threading.Event()  # set once every resource is registered
        self.started = False  # what to serve is decided (possibly nothing); read by /readyz
        self._kubelet = KubeletLink(
            settings.kubelet_socket, register, ready=self.ready, observer=observer, wake=self._kubelet_woke
        )
        self.gpus: list[GpuInfo] = []
        self._enumerated = False  # self.gpus holds an enumeration (served_gpus)

    # ---- requests from other threads (nvdp.base.signals' dispatcher, tests) --------------------------
    def request_stop(self) -> None:
        self._loop.request_stop()

    def request_reload(self) -> bool:
        """Ask for a reload; True when that made one pending (False: one already was, and this
        request is part of it)."""
        return self._loop.wake("reload")

    def abandon(self) -> None:
        """The stop did not finish (the loop is blocked): remove our sockets and the directory lock
        now, without waiting for the loop or the servers. Any thread; the process exits next."""
        for server in list(self.servers.values()):
            server.abandon()
        if self._dir_claim is not None:
            self._dir_claim.release()

    def _kubelet_woke(self) -> None:
        """The kubelet link's wake: the kubelet's stream of a resource ended (register it again)."""
        self._loop.wake("kubelet")

    # ---- main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until request_stop(). Raises InitError when NVML fails and fail-on-init-error."""
        if self._dir_claim is None:
            make_dirs(self.plugin_dir)
        elif not self._dir_claim.acquire(self._loop.stopped):
            return
        self._watcher = self._make_watcher(self.plugin_dir)
        self._loop.attach(self._watcher)
        try:
            self._start_nvml()
            if self._nvml_ok:
                self._apply(self.settings)
            retry_in: float | None = None
            pending = self._loop.take()
            while not self._loop.stopped.is_set():
                dir_retry = self._dir_claim.refresh() if self._dir_claim is not None else None
                if "reload" in pending:
                    self._do_reload()
                if "rescan" in pending:
                    self._do_rescan()
                if self._nvml_ok and self._gates.changed(self._watcher):
                    self._apply_node_facts()
                registering = self.settings.register_with_kubelet
                kubelet_id = self._socket_id(self.settings.kubelet_socket) if registering else None
                wait = dir_retry
                if not registering:  # serve without registering (an empty --kubelet-socket)
                    if dir_retry is None:
                        self._restart_wiped_servers()
                        self._kubelet.serve_unregistered(
                            {n: s for n, s in self.servers.items() if s.socket_is_ours()}
                        )
                        wait = self._loop.listen.retry_in()
                elif kubelet_id is None:
                    self._kubelet.kubelet_gone()
                    retry_in = None
                elif dir_retry is None:  # the directory is ours: (re)start servers, register
                    self._restart_wiped_servers()
                    listening = {n: s for n, s in self.servers.items() if s.socket_is_ours()}
                    retry_in = self._kubelet.register_pending(listening, kubelet_id, retry_in)
                    wait = sooner(retry_in, self._loop.listen.retry_in())
                if self._loop.stopped.is_set():
                    break
                pending = self._loop.wait(sooner(wait, self._gates.retry_in()))
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
        if self._watcher is not None:
            self._watcher.close()
        self._gates.stop()
        if self._dir_claim is not None:
            self._dir_claim.release()
        if self._nvml_ok:
            self._nvml.shutdown()
        log_event(log, logging.INFO, "stopped")

    # ---- resources and servers ----------------------------------------------------------------
    def _build(self, settings: DaemonSettings) -> NodeResources:
        """The resources of the node's devices under `settings`, without those a node fact withholds
        (MPS daemon not ready, missing device nodes), and every misfit found (each reported)."""
        self.gpus = self._nvml.gpus()
        self._enumerated = True
        gpus = self._gates.own_gpus(settings, self.gpus)
        minors = self._host_facts.mig_minors() if any(g.mig_enabled for g in gpus) else None
        built = settings.rules.build(gpus, minors)
        self._gates.report("resources", built.misfits)
        admitted = self._gates.admit(settings, built.resources)
        return NodeResources(admitted.resources, (*built.misfits, *admitted.misfits))

    def _serve(
        self,
        resource: Resource,
        socket_path: Path,
        options: ResponseOptions,
        allocator: PreferredAllocator | None,
    ) -> S:
        """Build and start the server of one resource, in place of any before it (to be registered
        once it listens: one that cannot is kept and started again with backoff)."""
        server = self._make_server(resource, socket_path, options, allocator)
        self.servers[resource.name] = server
        self._kubelet.expect(resource.name)
        self._loop.listen.start(resource.name, server.start)
        return server

    def _servers_changed(self) -> None:
        """Tell health and the observer which servers run now."""
        if self._health is not None:
            self._health.set_targets(list(self.servers.values()))
        if self._observer is not None:
            self._observer.servers_changed(dict(self.servers))
        self.started = True

    def _restart_wiped_servers(self) -> None:
        """Start a new server, same resource and socket, for each one whose socket was removed;
        start again those that could not listen, when their retry is due."""
        wiped: list[str] = []

        def serve_again(name: str, server: S) -> S:
            log_event(log, logging.INFO, "plugin socket removed; restarting server", resource=name)
            server.stop(grace=0.0)
            wiped.append(name)
            new = self._make_server(server.resource, server.socket_path, server.options, server.allocator)
            self.servers[name] = new
            self._kubelet.expect(name)
            return new

        self._loop.keep_serving(list(self.servers.items()), serve_again)
        if wiped:
            self._servers_changed()

    def _apply(self, settings: DaemonSettings) -> None:
        """Build resources and converge the running servers onto them (reload by diff)."""
        built = self._build(settings)
        resources, cdi_names, cdi_misfits = self._gates.publish(  # specs on disk before any registers
            settings, self.gpus, built.resources, self._nvml.driver_version
        )
        control_devices = self._host_facts.control_devices(settings.dev_root, settings.container_driver_root)
        options = replace(settings.response, control_devices=control_devices, cdi_devices=cdi_names)
        wanted = {r.name: r for r in resources}
        running = {n: (server.resource.signature(), server.options) for n, server in self.servers.items()}
        plan = plan_servers(running, {n: r.signature() for n, r in wanted.items()}, options)
        for name in plan.update:  # changed devices: same stream and registration
            self.servers[name].update_resource(wanted[name], self._allocator_for(wanted[name]))
            log_event(log, logging.INFO, "updated devices", resource=name, devices=len(wanted[name].devices))
        for name in (*plan.stop, *plan.restart):
            self.servers.pop(name).stop(grace=0.2)
            self._kubelet.forget(name)
            self._loop.listen.forget(name)
            reason = "removed" if name in plan.stop else "changed"
            log_event(log, logging.INFO, "stopped plugin", resource=name, reason=reason)
        for name, resource in wanted.items():
            if name not in plan.start and name not in plan.restart:
                continue
            server = self._serve(
                resource, self.plugin_dir / resource.socket_name, options, self._allocator_for(resource)
            )
            log_event(
                log,
                logging.INFO,
                "serving",
                resource=name,
                devices=len(resource.devices),
                socket=str(server.socket_path),
                sharing=resource.sharing,
            )
        self._gates.served(resources)
        self._gates.say_nothing_served(not wanted, len(self.gpus), (*built.misfits, *cdi_misfits))
        self.ready.clear()
        if self._health is not None:
            self._health.start(self.gpus, settings.health)
        self._servers_changed()

    def _allocator_for(self, resource: Resource) -> PreferredAllocator | None:
        return self._allocator_factory(resource, self.gpus) if self._allocator_factory else None

    def _init_failed(self, what: str, error: NvdpError) -> None:
        """NVIDIA's failOnInitError: exit with the reason, or say it once and idle until SIGHUP."""
        if self.settings.fail_on_init_error:
            raise InitError(f"{what}: {error}") from error
        log_event(
            log, logging.ERROR, f"{what}; idling until SIGHUP (fail-on-init-error=false)", error=str(error)
        )
        if self._observer is not None:
            self._observer.servers_changed({})  # idling on purpose: nothing to register
        self.started = True

    def _do_reload(self) -> None:
        log_event(log, logging.INFO, "reloading configuration")
        try:
            assert self._watcher is not None  # set by run() before its loop
            loaded = call_aside(self._reload_source, self._watcher, self._loop.stopped, "config-reload")
            if loaded is None:
                log_event(log, logging.INFO, "reload abandoned: stopping")
                return
            settings = loaded
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
        socket, registering = self.settings.kubelet_socket, self.settings.register_with_kubelet
        if (settings.kubelet_socket, settings.register_with_kubelet) != (socket, registering):
            log_event(
                log, logging.WARNING, "kubelet-socket changes take effect on restart", current=str(socket)
            )
            settings = replace(settings, kubelet_socket=socket, register_with_kubelet=registering)
        self.settings = settings
        log_event(log, logging.INFO, "reloaded", resources=",".join(sorted(self.servers)) or "none")
        if self._observer is not None:
            self._observer.reloaded(True)

    def _apply_node_facts(self) -> None:
        """A node fact the resources depend on changed: serve or withdraw what it concerns (others
        untouched: a reload by diff)."""
        try:
            self._apply(self.settings)
        except NvdpError as error:
            log_event(log, logging.ERROR, "cannot apply a node change", error=str(error))

    # ---- read by metrics and /readyz (nvdp.plugins.metrics.RegistrationState) --------------------------
    def registrations(self) -> dict[str, bool]:
        """Resource -> registered with the running kubelet, for every resource served (a snapshot
        that any thread may take)."""
        return self._kubelet.registrations()

    def restart_needed(self) -> str | None:
        """Why only a restart can serve again (the kubelet directory is a stale mount), for
        /healthz; None otherwise."""
        claim = self._dir_claim
        return claim.problem if claim is not None and claim.stale_mount else None

    def registration_problems(self) -> dict[str, str]:
        """Resource -> why it cannot be registered now (its server cannot listen, the kubelet
        directory is unusable), for /readyz; a snapshot that any thread may take."""
        problems = dict(self._loop.listen.failing)
        directory = self._dir_claim.problem if self._dir_claim is not None else None
        if directory is not None:
            problems = dict.fromkeys(list(self.servers), f"kubelet directory unusable: {directory}")
        return problems

    # ---- device layout changes (nvdp.plugins.kubeletplugin.rescan) -----------------------------------
    def request_rescan(self) -> None:
        """Apply the node's current layout with the current settings, as a reload does."""
        self._loop.wake("rescan")

    def served_gpus(self) -> list[GpuInfo] | None:
        """The enumeration the served resources come from; None before the first one."""
        return self.gpus if self._enumerated else None

    def _do_rescan(self) -> None:
        try:
            self._apply(self.settings)
        except NvdpError as error:
            log_event(
                log,
                logging.ERROR,
                "device layout change not served; keeping the previous resources",
                error=str(error),
            )
            return
        log_event(
            log, logging.INFO, "device layout applied", resources=",".join(sorted(self.servers)) or "none"
        )
