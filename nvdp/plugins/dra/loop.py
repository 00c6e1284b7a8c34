"""The DRA kubelet plugin's main loop: it keeps the slices, the health and the two sockets current.

- It sleeps in one inotify watch (`nvdp.plugins.kubeletplugin.serve_loop`) and wakes for: a rescan that saw
  a new layout (re-enumerate, republish), a health change, slices published (the hand-over record
  follows), a claim (un)prepared, a socket of ours removed or replaced (served again; the kubelet
  registers anew), a server that could not listen (retried with backoff), a stop.
- Its parts are built by `nvdp.plugins.dra.driver`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from nvdp.base.backoff import Backoff
from nvdp.base.dir_watch import DirWatcher
from nvdp.base.errors import NvdpError, NvmlError, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.logs import log_event
from nvdp.config.model import DraDevices
from nvdp.node.gpus.devices import (
    MIG_MINORS_FILE,
    Device,
    DeviceSet,
    gpu_device,
    mig_device,
    parse_mig_minors,
)
from nvdp.node.gpus.inventory import dra_gpus
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.health.node import NodeHealth
from nvdp.node.health.settings import health_settings
from nvdp.node.nvml.types import GpuInfo, Nvml
from nvdp.plugins.dra.capacity_mps import CapacityDaemons
from nvdp.plugins.dra.checkpoint import Checkpoint
from nvdp.plugins.dra.claim_parts import ClaimParts
from nvdp.plugins.dra.claim_specs import ClaimSpecs
from nvdp.plugins.dra.cluster import ResourceApi
from nvdp.plugins.dra.devices import DraDevice, DriverFacts, device_misfits, node_devices
from nvdp.plugins.dra.dynamic_mig import DynamicMig
from nvdp.plugins.dra.health import DraHealthTarget, HealthStreams
from nvdp.plugins.dra.names import CHECKPOINT_FILE
from nvdp.plugins.dra.node_count import NodeCountGate
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.nvidia_checkpoint import adopt as adopt_nvidia_checkpoint
from nvdp.plugins.dra.nvidia_checkpoint import current_boot_id
from nvdp.plugins.dra.options import DraSettings
from nvdp.plugins.dra.prepare import ClaimPreparer
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.plugins.dra.server import RequestObserver, add_plugin_services
from nvdp.plugins.handoff import Handoff
from nvdp.plugins.kubeletplugin.loop_watch import LoopWatch
from nvdp.plugins.kubeletplugin.registration import RegistrationService
from nvdp.plugins.kubeletplugin.serve_loop import ServeLoop, sooner
from nvdp.plugins.kubeletplugin.socket_server import UnixSocketServer

log = logging.getLogger(__name__)


class Preparing:
    """The claim preparer, once the loop built it at start (NVML up); None before. The claims' parts
    (the pods of the prepared claims) and the status page read it."""

    def __init__(self) -> None:
        self.preparer: ClaimPreparer | None = None


class InSlices:
    """The GPUs the slices say, as last published (told on the publisher's thread; a wake follows)."""

    def __init__(self, serve: ServeLoop) -> None:
        self._serve = serve
        self._lock = threading.Lock()
        self._gpus: frozenset[str] = frozenset()

    def published(self, devices: Sequence[DraDevice]) -> None:
        with self._lock:
            self._gpus = frozenset(d.gpu_uuid for d in devices)
        self._serve.wake("published")

    def gpus(self) -> frozenset[str]:
        with self._lock:
            return self._gpus


@dataclass(frozen=True)
class DraParts:
    """What the loop drives (`nvdp.plugins.dra.driver` builds them)."""

    nvml: Nvml
    api: ResourceApi
    health: NodeHealth
    state: NodeState
    target: DraHealthTarget
    streams: HealthStreams
    publisher: SlicePublisher
    in_slices: InSlices
    misfits: MisfitReport
    handoff: Handoff  # one GPU, one API: the GPUs the config gives DRA, handed over by the device plugin
    node_count: NodeCountGate  # a GPU newly served is offered once the Node no longer counts it
    registration: RegistrationService
    observer: RequestObserver | None  # told of each NodePrepareResources / NodeUnprepareResources
    capacity: CapacityDaemons  # the GPUs shared by capacity (their MPS daemons)
    dynamic_mig: DynamicMig  # MIG devices made at prepare
    claims: ClaimParts  # the prepared claims' configs, pods, health, Events
    preparing: Preparing  # the preparer, built at start


class DraLoop:
    """Serves until `request_stop()`; `reload()` resolves the settings again on SIGHUP (the config
    file's `dra` and `health` sections apply; the rest takes effect on restart)."""

    def __init__(
        self,
        settings: DraSettings,
        parts: DraParts,
        serve: ServeLoop,
        executor: ThreadPoolExecutor,
        reload: Callable[[], DraSettings] | None = None,
    ) -> None:
        self.settings = settings
        self.parts = parts
        self._serve = serve
        self._reload = reload
        self.nvml_failure: str | None = None  # why NVML cannot be initialised (retried), while so
        self.gpus: list[GpuInfo] | None = None
        self._facts = DriverFacts("", "")  # read from NVML at start
        self._minors: dict[str, int] | None = None
        self._serving: frozenset[str] = frozenset()  # the GPUs the hand-over lets DRA serve
        self._offered: frozenset[str] = frozenset()  # of them, those offered (the Node's count)
        self._gpu_of: dict[str, str] = {}  # device name (and former name) -> GPU uuid, as last settled
        # One grpc.Server for both sockets (the DRA one first: the kubelet dials it once registered).
        self._server = UnixSocketServer(
            settings.plugin_socket,
            self._add_services,
            executor,
            make_parent=True,
            also=(settings.registration_socket,),
        )
        self._watcher = DirWatcher(settings.registration_socket.parent)
        serve.attach(self._watcher)

    # ---- what the status page reads (`nvdp.plugins.dra.status.DraSources`)
    # ----------------------------------
    @property
    def sockets(self) -> tuple[UnixSocketServer]:
        """The server of the DRA socket and the registration socket."""
        return (self._server,)

    @property
    def preparer(self) -> ClaimPreparer | None:
        """None until the loop has started (NVML initialised)."""
        return self.parts.preparing.preparer

    @property
    def loop_watch(self) -> LoopWatch:
        return self._serve.watch

    @property
    def registration(self) -> RegistrationService:
        return self.parts.registration

    @property
    def publisher(self) -> SlicePublisher:
        return self.parts.publisher

    @property
    def state(self) -> NodeState:
        return self.parts.state

    @property
    def health(self) -> NodeHealth:
        return self.parts.health

    @property
    def misfits(self) -> MisfitReport:
        return self.parts.misfits

    def served_gpus(self) -> list[GpuInfo] | None:
        """The enumeration served (the device rescan's baseline); None before the first one."""
        return self.gpus

    # ---- control (any thread; signal handlers call request_stop) --------------------------------
    def request_stop(self) -> None:
        self._serve.request_stop()

    def request_reload(self) -> bool:
        """SIGHUP: read the config again and enumerate the GPUs again now. True when that made a
        reload pending."""
        return self._serve.wake("reload")

    def abandon(self) -> None:
        """A stop that did not finish: the kubelet must not keep finding the registration socket."""
        self._server.abandon()

    def _add_services(self, server: Any) -> None:
        assert self.preparer is not None
        add_plugin_services(server, self.preparer, self.parts.streams, self.parts.observer)
        self.parts.registration.add_to(server)

    # ---- the main loop ------------------------------------------------------------------------------
    def run(self, keep_claim: Callable[[], float | None] = lambda: None) -> None:
        """Serve until `request_stop()`; `keep_claim()` (`DirClaim.refresh`) on every wake-up."""
        serve, p = self._serve, self.parts
        try:
            if not self._init_nvml():
                return
            serve.watch.busy("start")
            self._start()
            while not serve.stopped.is_set():
                retries = (serve.listen, p.handoff, p.node_count)
                pending = serve.wait(sooner(keep_claim(), *(r.retry_in() for r in retries)))
                if serve.stopped.is_set():
                    break
                if "reload" in pending:
                    self._reload_config()
                settled = True
                if pending & {"reload", "rescan"}:
                    self._enumerate()
                elif "claims" in pending or p.handoff.due() or p.node_count.due():
                    self._settle()
                else:
                    settled = False
                if "published" in pending:
                    p.handoff.served(p.in_slices.gpus() | self._serving)
                if settled or "health" in pending:
                    self._push_health()
                self._keep_serving()
        finally:
            self._shutdown()

    def _init_nvml(self) -> bool:
        """NVML up (retried with backoff while it fails: a node without a driver yet); False on stop."""
        retries = Backoff(1.0, 60.0)
        serve = self._serve
        while not serve.stopped.is_set():
            serve.watch.busy("NVML init")
            try:
                self.parts.nvml.init()
                self.nvml_failure = None
                return True
            except NvmlError as error:
                self.nvml_failure = str(error)
                delay = retries.next()
                log_event(
                    log,
                    logging.ERROR,
                    "cannot initialise NVML; retrying",
                    error=str(error),
                    retry_in=f"{delay:.0f}s",
                )
                serve.watch.idle()
                self._watcher.wait(delay)  # wakes asked meanwhile stay pending for the loop
        return False

    def _start(self) -> None:
        p = self.parts
        facts = DriverFacts(p.nvml.driver_version(), p.nvml.cuda_driver_version())
        self._facts = facts
        specs = ClaimSpecs.of_node(self.settings, facts.driver_version)
        checkpoint = Checkpoint(self.settings.plugin_dir / CHECKPOINT_FILE)
        adopt_nvidia_checkpoint(checkpoint, current_boot_id())
        preparer = self.parts.preparing.preparer = ClaimPreparer(
            p.api,
            self.settings.node_name,
            p.state,
            specs,
            checkpoint,
            changed=self._serve.waker("claims"),
            shares=p.capacity,
            claims=p.claims,
            mig=p.dynamic_mig,
        )
        p.dynamic_mig.adopt(m for claim in preparer.prepared.values() for m in claim.made)
        self._enumerate()
        p.handoff.watch(self._watcher)
        p.health.set_targets([p.target])
        self._push_health()
        p.publisher.start()
        self._keep_serving()

    def _reload_config(self) -> None:
        """SIGHUP: the config file again; its `dra` and `health` sections apply now."""
        if self._reload is None:
            return
        try:
            settings = self._reload()
        except NvdpError as error:
            log_event(
                log, logging.ERROR, "reload failed; keeping the previous configuration", error=str(error)
            )
            return
        if replace(settings, config=self.settings.config) != self.settings:
            log_event(log, logging.WARNING, "settings other than the config file's take effect on restart")
        self.settings = replace(self.settings, config=settings.config)
        log_event(log, logging.INFO, "reloaded", dra_devices=said(settings.config.dra.devices))

    def _enumerate(self) -> None:
        """Read the node's GPUs and publish what DRA serves of them (start, a reload, a layout change)."""
        try:
            gpus = self.parts.nvml.gpus()
        except NvmlError as error:
            log_event(
                log, logging.ERROR, "cannot enumerate GPUs; keeping the last enumeration", error=str(error)
            )
            return
        self.gpus = gpus
        self._minors = _mig_minors()
        self.parts.health.start(gpus, health_settings(self.settings.config))
        self._settle()
        log_event(
            log,
            logging.INFO,
            "GPUs enumerated",
            gpus=len(gpus),
            dra_devices=said(self.settings.config.dra.devices),
            served=len(self._offered),
            devices=len(self.parts.state.devices()),
        )

    def _settle(self) -> None:
        """Serve the GPUs the config gives DRA, as the hand-over with the device plugin allows (a GPU
        it still serves or its pod holds waits; one a prepared claim holds stays until unprepared); a
        GPU newly served is offered once the Node no longer counts it among the device plugin's."""
        assert self.preparer is not None
        p = self.parts
        gpus = self.gpus or []
        owned, missing = dra_gpus(self.settings.config.dra.devices, gpus)
        placements = p.dynamic_mig.partitioned(self.settings.config.dra, gpus, self._facts, self._minors)
        static = [g for g in gpus if g.uuid not in placements.gpus]
        everything = node_devices(static, self._facts, self._minors) + placements.devices
        self._gpu_of = {n: d.gpu_uuid for d in everything for n in (d.name, d.former_name) if n}
        holds = self._holds()
        everything = p.capacity.settle(self.settings.config.dra, gpus, everything, holds, p.misfits)
        self._serving = p.handoff.settle(owned, holds, gpus).serve
        self._offered = p.node_count.offer(self._serving, self._offered, p.handoff.other.advertised())
        p.state.set_devices([d for d in everything if d.gpu_uuid in self._offered])
        records: list[Device] = []
        for gpu in (g for g in gpus if g.uuid in self._offered):
            migs = [mig_device(gpu, m, self._minors) for m in gpu.mig_devices] if gpu.mig_enabled else []
            whole = not gpu.mig_enabled or gpu.uuid in placements.gpus  # dynamic MIG: its placements' health
            records += migs + ([gpu_device(gpu)] if whole else [])
        p.target.set_devices(DeviceSet(records))
        labels = {g.uuid: f"GPU {g.index}" for g in gpus}
        p.misfits.update("handoff", (*missing, *p.handoff.misfits(labels), *p.node_count.misfits(labels)))
        p.misfits.update("devices", device_misfits([g for g in static if g.uuid in self._offered]))
        p.misfits.update("dynamic-mig", placements.misfits)

    def _holds(self) -> dict[str, str]:
        """GPU uuid -> the claim holding one of its devices (of the devices of the last settle)."""
        assert self.preparer is not None
        holds: dict[str, str] = {}
        for name, holder in self.preparer.holders().items():
            if name in self._gpu_of:
                holds.setdefault(self._gpu_of[name], holder)
        return holds

    def _push_health(self) -> None:
        p = self.parts
        p.state.set_health(p.target.unhealthy(), p.health.unhealthy())
        p.publisher.update(p.state.devices(), p.state.taints())
        p.claims.publish()
        p.streams.update(p.state.health())

    def _keep_serving(self) -> None:
        """Serve both sockets; when one's file was removed or replaced, both are served again (one
        server: the kubelet finds the registration socket made again and registers anew)."""
        if self._serve.keep_serving([(str(self.settings.plugin_socket), self._server)], _serve_again):
            self._watcher.add(self.settings.plugin_dir)  # a directory made again: watched again
            if not self._server.socket_is_ours():  # removed before the watch was there
                self._watcher.wake()

    def _shutdown(self) -> None:
        p = self.parts
        self._server.stop()  # the registration socket goes first: the kubelet deregisters the plugin
        if self.preparer is not None:  # no claim is (un)prepared now: the record says what is held
            p.handoff.hold(self._holds())
        p.capacity.stop()
        p.claims.close()  # its MPS daemons quit (NVML still up), its Events sent
        p.streams.stop()
        p.publisher.stop()
        p.health.stop()
        self._watcher.close()
        p.handoff.close()


def _serve_again(name: str, server: UnixSocketServer) -> UnixSocketServer:
    """The server to (re)start: one that was served had a socket file removed or replaced."""
    if server.serving:
        for path in server.unserved():
            log_event(log, logging.WARNING, "socket removed or replaced; serving it again", path=str(path))
        server.stop()
    return server


def said(devices: DraDevices) -> str:
    return devices if isinstance(devices, str) else ",".join(map(str, devices)) or "none"


def _mig_minors() -> dict[str, int] | None:
    """The host's MIG capability minors, where the driver lists them."""
    try:
        return parse_mig_minors(read_bounded(MIG_MINORS_FILE).decode("utf-8", "replace"))
    except UnreadableFile:
        return None
