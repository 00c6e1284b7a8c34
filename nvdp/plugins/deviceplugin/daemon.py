"""The plugin daemon's wiring: resolved config -> NVML backend -> supervisor, node health and metrics.

`Daemon` is what `nvdp plugin` runs on the main thread and what `nvdp simulate` runs on a thread. It
only builds and connects the parts: the config mapping is `nvdp.plugins.deviceplugin.daemon_settings`, the
node's health
`nvdp.node.health.node`, the main loop `nvdp.plugins.deviceplugin.supervisor`, the allocation ledger
`nvdp.plugins.ledger`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from nvdp.base.logs import NOTICE, log_event
from nvdp.config import PluginOptions
from nvdp.config.notices import migration_notices
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.gpus.resources import Resource
from nvdp.node.health.node import NodeHealth
from nvdp.node.health.settings import health_settings
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import GpuInfo, Nvml
from nvdp.plugins.deviceplugin.allocation import AllocationPolicy, Allocator, Topology
from nvdp.plugins.deviceplugin.daemon_settings import daemon_settings, imex_channels
from nvdp.plugins.deviceplugin.host_facts import RealHostFacts
from nvdp.plugins.deviceplugin.probe import rpc_problem
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import DevicePluginServer, PreferredAllocator
from nvdp.plugins.deviceplugin.status import AllocateNotice, RpcObserver
from nvdp.plugins.deviceplugin.supervisor import Supervisor
from nvdp.plugins.deviceplugin.types import DaemonSettings, StatusObserver
from nvdp.plugins.dra.checkpoint import dra_holds
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.handoff import DEVICE_PLUGIN, Handoff, device_plugin_record_dir
from nvdp.plugins.kubeletplugin.dir_lock import DirClaim
from nvdp.plugins.kubeletplugin.rescan import rescanner_for
from nvdp.plugins.ledger.ledger import AllocationLedger

if TYPE_CHECKING:
    from nvdp.node.health.node_condition import NodeConditionReporter
    from nvdp.node.health.node_events import NodeEventRecorder
    from nvdp.node.health.pod_events import PodEventRecorder
    from nvdp.plugins.metrics import MetricFamilies, Metrics
    from nvdp.plugins.uninstall import Release

log = logging.getLogger(__name__)

GRPC_WORKERS = 32


class TopologyAllocators:
    """Builds one Allocator per resource; the GPU link matrix is read from NVML once per enumeration."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._key: tuple[str, ...] = ()
        self._topology: Topology | None = None

    def __call__(self, resource: Resource, gpus: Sequence[GpuInfo]) -> PreferredAllocator | None:
        key = tuple(g.uuid for g in gpus)
        if key != self._key or self._topology is None:
            self._topology = Topology.from_nvml(self._nvml, gpus)
            self._key = key
        policy = AllocationPolicy(resource.allocation_policy or AllocationPolicy.DISTRIBUTED.value)
        return Allocator(list(resource.devices.values()), self._topology, policy=policy)


class GrpcServers:
    """The supervisor's server factory: DevicePluginServers whose unary RPCs share one gRPC thread
    pool (ListAndWatch streams run on a small pool of each server's own)."""

    def __init__(self, observer: RpcObserver | None) -> None:
        self._observer = observer
        self._executor = ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="grpc")

    def __call__(
        self,
        resource: Resource,
        socket_path: Path,
        options: ResponseOptions,
        allocator: PreferredAllocator | None,
    ) -> DevicePluginServer:
        return DevicePluginServer(resource, socket_path, options, self._executor, allocator, self._observer)

    def shutdown(self) -> None:
        """After the servers stopped: drop what is still queued."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def settings_source(load_options: Callable[[], PluginOptions]) -> Callable[[], DaemonSettings]:
    """The supervisor's `reload()`: load the config again (logged as the start-up line is) and map it."""

    def reload() -> DaemonSettings:
        options = load_options()
        log_event(log, logging.INFO, "configuration", config=json.loads(options.to_json()))
        log_notices(options)
        return node_settings(options)

    return reload


def log_notices(options: PluginOptions) -> None:
    """One NOTICE line per config key that NVIDIA's plugin ignores and nvdp applies."""
    for line in migration_notices(options.config):
        log_event(log, NOTICE, line, config_file=options.runtime.config_file)


def node_settings(options: PluginOptions) -> DaemonSettings:
    """The daemon settings with this node's facts read in: the IMEX channels present (with
    `imex.required`, a missing channel is a ConfigError, as NVIDIA's plugin refuses to start)."""
    return daemon_settings(options.config, imex_channels(options.config), options.runtime)


class Daemon:
    """The plugin process: builds NVML, metrics, node health and the supervisor from `options`;
    `reload_config` loads them again on a reload (SIGHUP)."""

    def __init__(
        self,
        options: PluginOptions,
        *,
        reload_config: Callable[[], PluginOptions],
        environ: Mapping[str, str],
        observer: StatusObserver[DevicePluginServer] | None = None,
        nvml: Nvml | None = None,
    ) -> None:
        self.options = options
        config, runtime = options.config, options.runtime
        self.nvml = nvml or open_nvml(
            runtime.nvml,
            config.flags.nvidia_driver_root,
            config.flags.plugin.container_driver_root,
            environ=environ,
        )
        # With the API server reachable (--kubeconfig / KUBECONFIG, else in-cluster) and the node named:
        # one Node event recorder for health transitions and misfits, one pod event recorder for the
        # pods they hit, and the GPU health condition's reporter.
        node, kubeconfig = runtime.node_name, runtime.kubeconfig
        self.node_events: NodeEventRecorder | None = None
        self.pod_events: PodEventRecorder | None = None
        self.node_condition: NodeConditionReporter | None = None
        self.release: Release | None = None  # asked at stop whether this is an uninstall
        if node:  # each needs the node's name: without one, their Kubernetes modules stay unloaded
            from nvdp.node.health.node_condition import node_condition_from_env
            from nvdp.node.health.node_events import node_events_from_env
            from nvdp.node.health.pod_events import pod_events_from_env
            from nvdp.plugins.uninstall import release_from_env

            self.node_events = node_events_from_env(environ, node=node, kubeconfig=kubeconfig)
            self.pod_events = pod_events_from_env(
                environ,
                node=node,
                kubeconfig=kubeconfig,
                recovery_quiet_period=lambda: self.health.recovery_quiet_period,
            )
            self.node_condition = node_condition_from_env(environ, node=node, kubeconfig=kubeconfig)
            self.release = release_from_env(environ, kubeconfig=kubeconfig)
        self.misfits = MisfitReport(self.node_events)
        # The kubelet's record of which container holds which device (its PodResources API).
        settings = node_settings(options)
        self.ledger = AllocationLedger.of_kubelet(settings.kubelet_socket)
        # Metrics only when --metrics-address is set, built in dependency order: the families count
        # from the start (failed NVML calls, the supervisor's StatusObserver); the endpoint reads the
        # supervisor and the node's health built next. An explicit observer replaces the families as
        # the supervisor's observer but not the endpoint.
        families: MetricFamilies | None = None
        counted = self.nvml
        if runtime.metrics_address:
            from nvdp.plugins.metrics import MetricFamilies

            families = MetricFamilies()
            counted = families.count_nvml_errors(self.nvml)
            observer = observer or families
        self.health = NodeHealth(
            counted,
            health_settings(config),
            environ,
            node_events=self.node_events,
            allocations=self.ledger,
            pod_events=self.pod_events,
            on_change=self.node_condition.changed if self.node_condition is not None else None,
        )
        if not self.health.checks_enabled:
            self.node_condition = None  # health checks off: nothing to say about the GPUs
        self.handoff = Handoff(
            DEVICE_PLUGIN, device_plugin_record_dir(settings.kubelet_socket, DRIVER_NAME), prove=dra_holds
        )
        self._servers = GrpcServers(AllocateNotice(self.ledger.allocated, observer))
        self.supervisor: Supervisor[DevicePluginServer] = Supervisor(
            counted,
            settings,
            reload=settings_source(reload_config),
            make_server=self._servers,
            host_facts=RealHostFacts(),
            allocator_factory=TopologyAllocators(counted),
            health=self.health,
            observer=observer,
            dir_claim=DirClaim(settings.kubelet_socket.parent, fail_if_held=settings.fail_on_init_error),
            misfits=self.misfits,
            handoff=self.handoff,
            holds=self.ledger.gpu_holders,
        )
        self.metrics: Metrics | None = None
        if families is not None:
            from nvdp.plugins.ledger.dra_file import ALLOCATIONS_FILE
            from nvdp.plugins.metrics import AllocationPages, Metrics, Probes

            probes = Probes(
                self.supervisor,
                self.health,
                self.misfits,
                rpc_probe=rpc_problem,
                registration_problems=self.supervisor.registration_problems,
                restart_needed=self.supervisor.restart_needed,
            )
            dra_file = device_plugin_record_dir(settings.kubelet_socket, DRIVER_NAME) / ALLOCATIONS_FILE
            allocations = AllocationPages(
                self.ledger,
                self.supervisor,
                self.health,
                self.supervisor.served_gpus,
                runtime.pod_detail,
                dra_file,
            )
            self.metrics = Metrics(runtime.metrics_address, families, probes, allocations=allocations)
        registry = families.registry if families is not None else None
        self.rescanner = rescanner_for(runtime.device_rescan_interval, counted, self.supervisor, registry)

    @property
    def ready(self) -> threading.Event:
        return self.supervisor.ready

    def request_stop(self) -> None:
        self.supervisor.request_stop()

    def request_reload(self) -> bool:
        return self.supervisor.request_reload()

    def abandon(self) -> None:
        """A stop that did not finish: see `Supervisor.abandon`."""
        self.supervisor.abandon()

    def run(self) -> None:
        log_event(log, logging.INFO, "starting nvdp", config=json.loads(self.options.to_json()))
        log_notices(self.options)
        # The device plugin is what the node's pods need: a taken metrics port must not take the GPUs
        # away with it (said loudly once; /metrics and the probes are off).
        if self.metrics is not None and not self.metrics.start_or_disable():
            self.metrics = None
        if self.rescanner is not None:
            self.rescanner.start()
        self.ledger.start()
        if self.node_condition is not None:
            self.node_condition.start(self.health)
        try:
            self.supervisor.run()
        finally:
            if self.node_condition is not None:
                self.node_condition.close()
            if self.rescanner is not None:
                self.rescanner.stop()
            self._servers.shutdown()
            if self.metrics is not None:
                self.metrics.stop()
            self.ledger.stop()
            if self.node_events is not None:
                self.node_events.close()
            if self.pod_events is not None:
                self.pod_events.close()
            self._clean_up_if_uninstalled()

    def _clean_up_if_uninstalled(self) -> None:
        """After an uninstall (not a restart, a rolling update or a drain: `nvdp.plugins.uninstall`), what
        this plugin wrote for the node goes: the GPU health condition and taint, and the hand-over record
        unless its pods hold GPUs. CDI specs stay: running containers use them."""
        if self.release is None or not self.release.removed():
            return
        from nvdp import kube
        from nvdp.node.health.node_condition import withdraw
        from nvdp.plugins.uninstall import remove_handoff_record

        node = self.options.runtime.node_name
        timeout = self.release.timeout
        withdraw(kube.KubeNodeStatus(node, api_client=self.release.api_client, request_timeout=timeout))
        remove_handoff_record(self.handoff)
