"""`nvdp dra-kubelet-plugin` put together: NVML, the node's health, the slice publisher, the claim
preparer and the two gRPC servers, and the main loop that keeps them current.

The main loop sleeps in one inotify watch (the kubelet's registration and plugin directories) and is
woken by what changes: a device rescan that saw a new layout (re-enumerate, republish), a health
change (taints, the kubelet's health stream), a socket of ours removed or replaced (serve it again:
the kubelet finds the new registration socket and registers the plugin again), a server that could
not listen (retried with backoff), a stop. Nothing polls while nothing changes but the device rescan
(`--device-rescan-interval`, NVML's cheap layout query) and the health monitor's NVML event wait.
With `--metrics-address`, `nvdp.dra.status` serves /metrics, /healthz and /readyz from these parts.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

from nvdp.backoff import Backoff
from nvdp.config.model import DraDevices
from nvdp.daemon_settings import health_settings
from nvdp.devices import MIG_MINORS_FILE, Device, DeviceSet, gpu_device, mig_device, parse_mig_minors
from nvdp.dir_watch import DirWatcher
from nvdp.dra.capacity_mps import CapacityDaemons
from nvdp.dra.checkpoint import Checkpoint
from nvdp.dra.claim_specs import ClaimSpecs
from nvdp.dra.cluster import KubeResourceApi, ResourceApi
from nvdp.dra.devices import DraDevice, DriverFacts, device_misfits, node_devices
from nvdp.dra.dynamic_mig import DynamicMig, mig_control_of
from nvdp.dra.health import DraHealthTarget, HealthStreams
from nvdp.dra.loop_watch import LoopWatch
from nvdp.dra.names import CHECKPOINT_FILE
from nvdp.dra.node_count import NodeCountGate
from nvdp.dra.node_state import NodeState
from nvdp.dra.nvidia_checkpoint import adopt as adopt_nvidia_checkpoint
from nvdp.dra.nvidia_checkpoint import current_boot_id
from nvdp.dra.options import DraSettings, resolve_dra
from nvdp.dra.prepare import ClaimPreparer
from nvdp.dra.publisher import SlicePublisher
from nvdp.dra.server import RegistrationService, UnixServer, add_plugin_services
from nvdp.errors import NvdpError, NvmlError, UnreadableFile
from nvdp.files import read_bounded
from nvdp.handoff import DRA, Handoff
from nvdp.health.node import NodeHealth
from nvdp.health.node_events import node_events_from_env
from nvdp.inventory import dra_gpus
from nvdp.logs import log_event, setup_logging
from nvdp.misfit_report import MisfitReport
from nvdp.nvml import open_nvml
from nvdp.nvml.types import GpuInfo, Nvml
from nvdp.plugin.listen_retry import ListenRetry
from nvdp.plugin.rescan import LayoutRescanner, layout_change_counter

log = logging.getLogger(__name__)

GRPC_WORKERS = 16


class DraDriver:
    """Built from resolved settings (`nvdp.dra.options.resolve_dra`); `run()` until `request_stop()`.
    `reload` resolves them again on SIGHUP (the config file's `dra` and `health` sections apply; the
    rest takes effect on restart). `nvml` and `api` replace the backends the settings name (tests,
    `nvdp simulate --api dra`)."""

    def __init__(
        self,
        settings: DraSettings,
        environ: Mapping[str, str],
        *,
        nvml: Nvml | None = None,
        api: ResourceApi | None = None,
        reload: Callable[[], DraSettings] | None = None,
    ) -> None:
        self.settings = settings
        config, runtime = settings.config, settings.runtime
        flags = config.flags
        self.nvml = nvml or open_nvml(
            runtime.nvml, flags.nvidia_driver_root, flags.plugin.container_driver_root, environ=environ
        )
        self.status = None  # metrics only with --metrics-address, counting from the start (NVML calls)
        if runtime.metrics_address:
            from nvdp.dra.status import DraStatus

            self.status = DraStatus(runtime.metrics_address, self)
            self.nvml = self.status.counters.families.count_nvml_errors(self.nvml)
        counters = self.status.counters if self.status is not None else None
        self._reload = counters.counted_reload(reload) if counters and reload else reload
        self.loop = LoopWatch()  # /healthz: the main loop takes up its wakes
        self.nvml_failure: str | None = None  # why NVML cannot be initialised (retried), while so
        if api is None:
            from nvdp.kube import new_api_client

            api = KubeResourceApi(new_api_client(kubeconfig=settings.kubeconfig or None, retries=0))
        self.api = api
        self.node = settings.node_name
        self.node_events = node_events_from_env(environ, node=self.node, kubeconfig=settings.kubeconfig)
        self.health = NodeHealth(self.nvml, health_settings(config), environ, node_events=self.node_events)
        self.state = NodeState()
        self.dynamic_mig = DynamicMig(mig_control_of(self.nvml), lambda: self.nvml.mig_layout())
        self.target = DraHealthTarget(lambda: self._wake("health"))
        self.streams = HealthStreams(self.node)
        self.publisher = SlicePublisher(api, self.node, on_published=self._published)
        self.misfits = MisfitReport(self.node_events)
        # One GPU, one API: the GPUs the config gives DRA, handed over by the device plugin.
        self.handoff = Handoff(DRA, settings.plugin_dir)
        self._serve: frozenset[str] = frozenset()  # the GPUs the hand-over lets DRA serve
        # of them, those offered: a GPU taken from the device plugin once the Node no longer counts it
        self.node_count = NodeCountGate(api, self.node)
        self._offered: frozenset[str] = frozenset()
        self._in_slices: frozenset[str] = frozenset()  # the GPUs the slices say, as last published
        self._minors: dict[str, int] | None = None
        self.registration = RegistrationService(
            settings.plugin_socket, counters.registered if counters else None, self.streams.expect_kubelet
        )
        self.preparer: ClaimPreparer | None = None
        self.gpus: list[GpuInfo] | None = None
        self._facts = DriverFacts("", "")  # read from NVML at start
        self._executor = ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="dra-grpc")
        self._plugin_server = UnixServer(settings.plugin_socket, self._add_plugin_services, self._executor)
        self._registration_server = UnixServer(
            settings.registration_socket, self.registration.add_to, self._executor
        )
        self.sockets = (self._plugin_server, self._registration_server)
        self._listen = ListenRetry()
        self._watcher = DirWatcher(settings.registration_socket.parent)
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._stop = threading.Event()
        interval = runtime.device_rescan_interval
        counted = layout_change_counter(counters.families.registry) if counters else None
        wake = partial(self._wake, "rescan")
        self.rescanner = (
            LayoutRescanner(self.nvml.mig_layout, lambda: self.gpus, wake, interval, counted=counted)
            if interval > 0
            else None
        )
        self._counters = counters
        self.capacity = CapacityDaemons.for_node(self.nvml, settings, environ)  # GPUs shared by capacity

    # ---- control (any thread; signal handlers call request_stop) --------------------------------

    def request_stop(self) -> None:
        self._stop.set()
        self._watcher.wake()

    def request_reload(self) -> bool:
        """SIGHUP: read the config again and enumerate the GPUs again now. True when that made a
        reload pending."""
        with self._lock:
            pending = "reload" not in self._pending
        self._wake("reload")
        return pending

    def abandon(self) -> None:
        """A stop that did not finish: the kubelet must not keep finding the registration socket."""
        self._registration_server.abandon()

    def _wake(self, what: str) -> None:
        with self._lock:
            self._pending.add(what)
        self.loop.woken()
        self._watcher.wake()

    def _add_plugin_services(self, server: Any) -> None:
        assert self.preparer is not None
        add_plugin_services(server, self.preparer, self.streams, self._counters)

    # ---- the main loop ------------------------------------------------------------------------------

    def run(self, keep_claim: Callable[[], float | None] = lambda: None) -> None:
        """Serve until `request_stop()`; `keep_claim()` (`DirClaim.refresh`) on every wake-up."""
        log_event(
            log, logging.INFO, "starting nvdp dra-kubelet-plugin", config=json.loads(self.settings.to_json())
        )
        if self.status is not None and not self.status.start_or_disable():
            self.status = None
        try:
            if not self._init_nvml():
                return
            self.loop.busy("start")
            self._start()
            while not self._stop.is_set():
                self.loop.idle()
                retries = (self._listen, self.handoff, self.node_count)
                self._watcher.wait(_sooner(keep_claim(), *(r.retry_in() for r in retries)))
                with self._lock:
                    pending, self._pending = self._pending, set()
                self.loop.busy(",".join(sorted(pending)) or "a directory change")
                if self._stop.is_set():
                    break
                if "reload" in pending:
                    self._reload_config()
                settled = True
                if pending & {"reload", "rescan"}:
                    self._enumerate()
                elif "claims" in pending or self.handoff.due() or self.node_count.due():
                    self._settle()
                else:
                    settled = False
                if "published" in pending:
                    with self._lock:
                        in_slices = self._in_slices
                    self.handoff.served(in_slices | self._serve)
                if settled or "health" in pending:
                    self._push_health()
                self._keep_serving()
        finally:
            self._shutdown()

    def _init_nvml(self) -> bool:
        """NVML up (retried with backoff while it fails: a node without a driver yet); False on stop."""
        retries = Backoff(1.0, 60.0)
        while not self._stop.is_set():
            self.loop.busy("NVML init")
            try:
                self.nvml.init()
                self.nvml_failure = None
                return True
            except NvmlError as error:
                self.nvml_failure = str(error)
                self.loop.idle()
                delay = retries.next()
                log_event(
                    log,
                    logging.ERROR,
                    "cannot initialise NVML; retrying",
                    error=str(error),
                    retry_in=f"{delay:.0f}s",
                )
                self._watcher.wait(delay)
        return False

    def _start(self) -> None:
        self._facts = facts = DriverFacts(self.nvml.driver_version(), self.nvml.cuda_driver_version())
        specs = ClaimSpecs.of_node(self.settings, facts.driver_version)
        checkpoint = Checkpoint(self.settings.plugin_dir / CHECKPOINT_FILE)
        adopt_nvidia_checkpoint(checkpoint, current_boot_id())
        self.preparer = ClaimPreparer(
            self.api,
            self.node,
            self.state,
            specs,
            checkpoint,
            changed=lambda: self._wake("claims"),
            shares=self.capacity,
            mig=self.dynamic_mig,
        )
        self.dynamic_mig.adopt(m for claim in self.preparer.prepared.values() for m in claim.made)
        self._enumerate()
        self.handoff.watch(self._watcher)
        self.health.set_targets([self.target])
        self._push_health()
        self.publisher.start()
        self._keep_serving()
        if self.rescanner is not None:
            self.rescanner.start()

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
        log_event(log, logging.INFO, "reloaded", dra_devices=_said(settings.config.dra.devices))

    def _enumerate(self) -> None:
        """Read the node's GPUs and publish what DRA serves of them (start, a reload, a layout change)."""
        try:
            gpus = self.nvml.gpus()
        except NvmlError as error:
            log_event(
                log, logging.ERROR, "cannot enumerate GPUs; keeping the last enumeration", error=str(error)
            )
            return
        self.gpus = gpus
        self._minors = _mig_minors()
        self.health.start(gpus, health_settings(self.settings.config))
        self._settle()
        log_event(
            log,
            logging.INFO,
            "GPUs enumerated",
            gpus=len(gpus),
            dra_devices=_said(self.settings.config.dra.devices),
            served=len(self._offered),
            devices=len(self.state.devices()),
        )

    def _settle(self) -> None:
        """Serve the GPUs the config gives DRA, as the hand-over with the device plugin allows (a GPU
        it still serves or its pod holds waits; one a prepared claim holds stays until unprepared); a
        GPU newly served is offered once the Node no longer counts it among the device plugin's."""
        assert self.preparer is not None
        gpus = self.gpus or []
        owned, missing = dra_gpus(self.settings.config.dra.devices, gpus)
        parts = self.dynamic_mig.partitioned(self.settings.config.dra, gpus, self._facts, self._minors)
        static = [g for g in gpus if g.uuid not in parts.gpus]
        everything = node_devices(static, self._facts, self._minors) + parts.devices
        gpu_of = {n: d.gpu_uuid for d in everything for n in (d.name, d.former_name) if n}
        holds: dict[str, str] = {}
        for name, holder in ((n, h) for n, h in self.preparer.holders().items() if n in gpu_of):
            holds.setdefault(gpu_of[name], holder)
        everything = self.capacity.settle(self.settings.config.dra, gpus, everything, holds, self.misfits)
        self._serve = self.handoff.settle(owned, holds, gpus).serve
        self._offered = self.node_count.offer(self._serve, self._offered, self.handoff.other.advertised())
        self.state.set_devices([d for d in everything if d.gpu_uuid in self._offered])
        records: list[Device] = []
        for gpu in (g for g in gpus if g.uuid in self._offered):
            migs = [mig_device(gpu, m, self._minors) for m in gpu.mig_devices] if gpu.mig_enabled else []
            whole = not gpu.mig_enabled or gpu.uuid in parts.gpus  # dynamic MIG: its placements' health
            records += migs + ([gpu_device(gpu)] if whole else [])
        self.target.set_devices(DeviceSet(records))
        labels = {g.uuid: f"GPU {g.index}" for g in gpus}
        self.misfits.update(
            "handoff", (*missing, *self.handoff.misfits(labels), *self.node_count.misfits(labels))
        )
        self.misfits.update("devices", device_misfits([g for g in static if g.uuid in self._offered]))
        self.misfits.update("dynamic-mig", parts.misfits)

    def _published(self, devices: Sequence[DraDevice]) -> None:
        """The slices say `devices` now (the publisher's thread): the hand-over record follows."""
        with self._lock:
            self._in_slices = frozenset(d.gpu_uuid for d in devices)
        self._wake("published")

    def _push_health(self) -> None:
        self.state.set_health(self.target.unhealthy(), self.health.unhealthy())
        self.publisher.update(self.state.devices(), self.state.taints())
        self.streams.update(self.state.health())

    def _keep_serving(self) -> None:
        """Serve both sockets (the DRA one first: the kubelet dials it once registered); one whose
        file was removed or replaced is served again."""
        due = self._listen.take_due()
        for server in (self._plugin_server, self._registration_server):
            if server.is_ours():
                continue
            if server.serving:  # its socket file was removed or replaced
                log_event(
                    log,
                    logging.WARNING,
                    "socket removed or replaced; serving it again",
                    path=str(server.path),
                )
                server.stop()
            name = str(server.path)
            if name in self._listen.failing and not due:
                continue
            if not self._listen.start(_Named(server)):
                return  # the registration waits for the DRA socket
            if server is self._plugin_server:
                self._watcher.add(self.settings.plugin_dir)  # a directory made again: watched again
                if not server.is_ours():  # removed before the watch was there: no event will say so
                    self._watcher.wake()

    def _shutdown(self) -> None:
        if self.rescanner is not None:
            self.rescanner.stop()
        self._registration_server.stop()  # the kubelet deregisters the plugin first
        self._plugin_server.stop()
        self.capacity.stop()
        self.streams.stop()
        self.publisher.stop()
        self.health.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.nvml.shutdown()
        self._watcher.close()
        self.handoff.close()
        if self.node_events is not None:
            self.node_events.close()
        if self.status is not None:
            self.status.stop()
        log_event(log, logging.INFO, "stopped nvdp dra-kubelet-plugin", node=self.node)


def from_command_line(args: argparse.Namespace, environ: Mapping[str, str]) -> DraDriver:
    """The driver of `nvdp dra-kubelet-plugin`: its settings resolved, logging set up. Raises
    NvdpError (one line): a bad setting, no kubeconfig."""
    settings = resolve_dra(args, environ)
    setup_logging(settings.runtime.log_format, settings.runtime.log_level)
    return DraDriver(settings, environ, reload=lambda: resolve_dra(args, environ))


class _Named:
    """A UnixServer as ListenRetry names servers (by socket path)."""

    def __init__(self, server: UnixServer) -> None:
        self._server = server

    @property
    def resource_name(self) -> str:
        return str(self._server.path)

    def start(self) -> None:
        self._server.start()


def _sooner(*delays: float | None) -> float | None:
    return min((d for d in delays if d is not None), default=None)


def _said(devices: DraDevices) -> str:
    return devices if isinstance(devices, str) else ",".join(map(str, devices)) or "none"


def _mig_minors() -> dict[str, int] | None:
    """The host's MIG capability minors, where the driver lists them."""
    try:
        return parse_mig_minors(read_bounded(MIG_MINORS_FILE).decode("utf-8", "replace"))
    except UnreadableFile:
        return None
