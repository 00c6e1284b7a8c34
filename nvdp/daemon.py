"""The plugin daemon: resolved config -> NVML backend -> supervisor, health and metrics.

`Daemon` is what `nvdp plugin` runs on the main thread and what `nvdp simulate` runs on a thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nvdp.allocation import Allocator, Topology
from nvdp.config import Config
from nvdp.errors import ConfigError, NvdpError
from nvdp.health import HealthChange, HealthMonitor, HealthRouter, HealthSettings, MonitorStatus, XidPolicy
from nvdp.logs import log_event
from nvdp.nvml import open_nvml
from nvdp.nvml.types import GpuInfo, Nvml
from nvdp.plugin.responses import ResponseOptions
from nvdp.plugin.server import DevicePluginServer, PreferredAllocator
from nvdp.plugin.supervisor import DaemonSettings, StatusObserver, Supervisor
from nvdp.resources import NamePattern, Replication, Resource

if TYPE_CHECKING:
    from nvdp.metrics import Metrics

log = logging.getLogger(__name__)


def daemon_settings(config: Config) -> DaemonSettings:
    """Map the resolved v1 config onto what the supervisor needs."""
    flags = config.flags
    plugin = flags.plugin
    if not plugin.kubelet_socket:
        raise ConfigError("--kubelet-socket / KUBELET_SOCKET: empty; nvdp needs the kubelet's socket path")
    if flags.device_discovery_strategy == "tegra":
        raise ConfigError(
            "--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY: tegra is not supported by nvdp "
            "(accepted here: auto, nvml)"
        )
    sharing: list[Replication] = []
    replicated = config.sharing.replicated
    if replicated is not None:
        strategy = config.sharing.strategy
        for entry in replicated.resources:
            sharing.append(
                Replication(
                    name=entry.name,
                    replicas=entry.replicas,
                    rename=entry.rename,
                    devices=entry.devices,
                    strategy=strategy,
                    fail_requests_greater_than_one=bool(replicated.fail_requests_greater_than_one),
                )
            )
    return DaemonSettings(
        kubelet_socket=Path(plugin.kubelet_socket),
        mig_strategy=flags.mig_strategy,
        fail_on_init_error=flags.fail_on_init_error,
        dev_root=flags.nvidia_dev_root or flags.nvidia_driver_root,
        container_driver_root=plugin.container_driver_root,
        gpu_patterns=tuple(NamePattern(r.pattern, r.name) for r in config.resources.gpus),
        mig_patterns=tuple(NamePattern(r.pattern, r.name) for r in config.resources.mig),
        sharing=tuple(sharing),
        health=health_settings(config),
        response=ResponseOptions(
            device_list_strategy=plugin.device_list_strategy,
            device_id_strategy=plugin.device_id_strategy,
            pass_device_specs=plugin.pass_device_specs,
            dev_root=flags.nvidia_dev_root or flags.nvidia_driver_root,
            cdi_annotation_prefix=plugin.cdi_annotation_prefix,
            extra_envs=feature_envs(config),
            mps_root=flags.mps_root,
        ),
    )


def feature_envs(config: Config) -> tuple[tuple[str, str], ...]:
    """Env vars NVIDIA's plugin adds to every container for GDS, MOFED, GDRCopy and IMEX channels;
    the NVIDIA container toolkit acts on them."""
    flags = config.flags
    envs = [
        (name, "enabled")
        for name, on in (
            ("NVIDIA_GDS", flags.gds_enabled),
            ("NVIDIA_MOFED", flags.mofed_enabled),
            ("NVIDIA_GDRCOPY", flags.gdrcopy_enabled),
        )
        if on
    ]
    if config.imex.channel_ids:
        envs.append(("NVIDIA_IMEX_CHANNELS", ",".join(str(c) for c in config.imex.channel_ids)))
    return tuple(envs)


def health_settings(config: Config) -> HealthSettings:
    h = config.health
    return HealthSettings(
        ignored_xids=frozenset(h.ignored_xids),
        fatal_xids=None if h.fatal_xids is None else frozenset(h.fatal_xids),
        recovery_quiet_period=h.recovery_quiet_period,
        probe_interval=h.probe_interval,
        single_bit_ecc=h.single_bit_ecc,
    )


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
        return Allocator(list(resource.devices.values()), self._topology)


class NodeHealth:
    """One health monitor per node feeding one router; the supervisor's HealthHooks."""

    def __init__(self, nvml: Nvml, settings: HealthSettings, environ: Mapping[str, str]) -> None:
        self._nvml = nvml
        self._settings = settings
        self._environ = environ
        self._gpus: list[GpuInfo] = []
        self.policy = XidPolicy.from_env(environ, settings)
        node_events = None
        if self.policy.enabled:
            from nvdp.kube import node_events_from_env

            node_events = node_events_from_env(environ)
        self.router = HealthRouter(node_events=node_events)
        self.monitor: HealthMonitor | None = None

    def start(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None) -> None:
        if settings is not None and settings != self._settings:
            self._settings = settings
            self.policy = XidPolicy.from_env(self._environ, settings)
            if self.monitor is not None:
                self.monitor.update_settings(settings, self.policy)
        if self.monitor is None:
            self.monitor = HealthMonitor(
                self._nvml, gpus, self.router, settings=self._settings, policy=self.policy
            )
            self.monitor.start()
        elif list(gpus) != self._gpus:
            # Only a changed enumeration re-arms the event set: freeing it drops queued events.
            self.monitor.update_gpus(gpus)
        self._gpus = list(gpus)

    def set_targets(self, servers: Sequence[DevicePluginServer]) -> None:
        self.router.set_targets(servers)

    # ---- read by metrics and /readyz (nvdp.metrics.HealthView) ----
    @property
    def checks_enabled(self) -> bool:
        return self.policy.enabled

    def monitor_status(self) -> MonitorStatus | None:
        return self.monitor.status() if self.monitor is not None else None

    def unhealthy(self) -> dict[str, HealthChange]:
        return self.router.unhealthy()

    def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self.router.close()


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        reload_config: Callable[[], Config],
        environ: Mapping[str, str],
        observer: StatusObserver | None = None,
        nvml: Nvml | None = None,
    ) -> None:
        self.config = config
        self._reload_config = reload_config
        self._first = True
        self.nvml = nvml or open_nvml(config.nvml, config.flags.nvidia_driver_root)
        # Metrics only when --metrics-address is set; an explicit observer
        # replaces the metrics observer but not the endpoint.
        self.metrics: Metrics | None = None
        counted = self.nvml
        if config.metrics_address:
            from nvdp.metrics import Metrics

            self.metrics = Metrics(config.metrics_address)
            counted = self.metrics.count_nvml_errors(self.nvml)
            observer = observer or self.metrics
        self.health = NodeHealth(counted, health_settings(config), environ)
        if self.metrics is not None:
            self.metrics.health = self.health
        self.supervisor = Supervisor(
            counted,
            self._settings,
            allocator_factory=TopologyAllocators(counted),
            health=self.health,
            observer=observer,
        )

    def _settings(self) -> DaemonSettings:
        if self._first:
            self._first = False
        else:
            self.config = self._reload_config()
            log_event(log, logging.INFO, "configuration", config=json.loads(self.config.to_json()))
        return daemon_settings(self.config)

    @property
    def ready(self) -> threading.Event:
        return self.supervisor.ready

    def request_stop(self) -> None:
        self.supervisor.request_stop()

    def request_reload(self) -> None:
        self.supervisor.request_reload()

    def run(self) -> None:
        log_event(log, logging.INFO, "starting nvdp", config=json.loads(self.config.to_json()))
        if self.metrics is not None:
            try:
                self.metrics.start()
            except NvdpError as error:
                # The device plugin is what the node's pods need; a taken metrics port must not
                # take the GPUs away with it. Said loudly once; /metrics and the probes are off.
                log_event(
                    log,
                    logging.ERROR,
                    "metrics endpoint disabled; serving devices without it",
                    error=str(error),
                )
                self.metrics = None
        try:
            self.supervisor.run()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
