"""`nvdp dra-kubelet-plugin` put together: NVML, the node's health, the slice publisher, the
hand-over with the device plugin, the registration, the main loop (`nvdp.plugins.dra.loop`) and, with
`--metrics-address`, the status page (`nvdp.plugins.dra.status`: /metrics, /healthz, /readyz).

`DraDriver` only builds and connects the parts, in dependency order: the counted metric families
first (they count from the start: NVML calls, reloads, registrations), the status page last, from
the parts built. Nothing polls while nothing changes but the device rescan
(`--device-rescan-interval`, NVML's cheap layout query) and the health monitor's NVML event wait.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nvdp.base.logs import log_event, setup_logging
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import Nvml
from nvdp.plugins.dra.capacity_mps import CapacityDaemons
from nvdp.plugins.dra.claim_parts import ClaimParts
from nvdp.plugins.dra.cluster import KubeResourceApi, ResourceApi
from nvdp.plugins.dra.dynamic_mig import DynamicMig, mig_control_of
from nvdp.plugins.dra.health import DraHealthTarget, HealthStreams
from nvdp.plugins.dra.loop import DraLoop, DraParts, InSlices, Preparing
from nvdp.plugins.dra.node_count import NodeCountGate
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.options import DraSettings, resolve_dra
from nvdp.plugins.dra.prepare import ClaimPreparer
from nvdp.plugins.dra.publisher import SlicePublisher
from nvdp.plugins.dra.server import dra_registration
from nvdp.plugins.dra.status import DraCounters, DraStatus
from nvdp.plugins.handoff import DRA, Handoff
from nvdp.plugins.kubeletplugin.rescan import LayoutRescanner, layout_change_counter
from nvdp.plugins.kubeletplugin.serve_loop import ServeLoop

log = logging.getLogger(__name__)

GRPC_WORKERS = 16


class DraDriver:
    """Built from resolved settings (`nvdp.plugins.dra.options.resolve_dra`); `run()` until `request_stop()`.
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
        config, runtime = settings.config, settings.runtime
        flags = config.flags
        nvml = nvml or open_nvml(
            runtime.nvml, flags.nvidia_driver_root, flags.plugin.container_driver_root, environ=environ
        )
        # metrics only with --metrics-address, counting from the start (NVML calls)
        counters = DraCounters() if runtime.metrics_address else None
        self.nvml = counted = counters.families.count_nvml_errors(nvml) if counters else nvml
        if counters is not None and reload is not None:
            reload = counters.counted_reload(reload)
        if api is None:
            from nvdp.kube import new_api_client

            api = KubeResourceApi(new_api_client(kubeconfig=settings.kubeconfig or None, retries=0))
        node = settings.node_name
        state, preparing = NodeState(), Preparing()
        claims = ClaimParts.of(_ClaimSources(counted, api, state, preparing), settings, environ)
        self.node_events = claims.node_events  # the Events of health transitions, misfits, claims
        serve = ServeLoop()
        streams = HealthStreams(node)
        in_slices = InSlices(serve)
        self.handoff = Handoff(DRA, settings.plugin_dir)
        self.publisher = SlicePublisher(api, node, on_published=in_slices.published)
        parts = DraParts(
            nvml=counted,
            api=api,
            health=claims.health,  # its transitions name the claims and pods they hit
            state=state,
            target=DraHealthTarget(serve.waker("health")),
            streams=streams,
            publisher=self.publisher,
            in_slices=in_slices,
            misfits=MisfitReport(self.node_events),
            handoff=self.handoff,
            node_count=NodeCountGate(api, node),
            registration=dra_registration(
                settings.plugin_socket, counters.registered if counters else None, streams.expect_kubelet
            ),
            observer=counters,
            capacity=CapacityDaemons(claims.sharing.mps),  # GPUs shared by capacity: the same MPS daemons
            dynamic_mig=DynamicMig(mig_control_of(counted), counted.mig_layout),
            claims=claims,
            preparing=preparing,
        )
        self._executor = ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="dra-grpc")
        self.loop = DraLoop(settings, parts, serve, self._executor, reload)
        interval = runtime.device_rescan_interval
        self.rescanner = (
            LayoutRescanner(
                counted.mig_layout,
                self.loop.served_gpus,
                serve.waker("rescan"),
                interval,
                counted=layout_change_counter(counters.families.registry) if counters else None,
            )
            if interval > 0
            else None
        )
        self.status = DraStatus(runtime.metrics_address, counters, self.loop) if counters else None

    @property
    def settings(self) -> DraSettings:
        """The settings served (a reload changes the config's)."""
        return self.loop.settings

    @property
    def preparer(self) -> ClaimPreparer | None:
        """None until the driver has started (NVML initialised)."""
        return self.loop.preparer

    def request_stop(self) -> None:
        self.loop.request_stop()

    def request_reload(self) -> bool:
        return self.loop.request_reload()

    def abandon(self) -> None:
        """A stop that did not finish: see `DraLoop.abandon`."""
        self.loop.abandon()

    def run(self, keep_claim: Callable[[], float | None] = lambda: None) -> None:
        """Serve until `request_stop()`; `keep_claim()` (`DirClaim.refresh`) on every wake-up."""
        log_event(
            log, logging.INFO, "starting nvdp dra-kubelet-plugin", config=json.loads(self.settings.to_json())
        )
        if self.status is not None and not self.status.start_or_disable():
            self.status = None
        if self.rescanner is not None:
            self.rescanner.start()  # no tick before the first enumeration
        try:
            self.loop.run(keep_claim)
        finally:
            if self.rescanner is not None:
                self.rescanner.stop()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self.nvml.shutdown()
            if self.status is not None:
                self.status.stop()
            log_event(log, logging.INFO, "stopped nvdp dra-kubelet-plugin", node=self.settings.node_name)


def from_command_line(args: argparse.Namespace, environ: Mapping[str, str]) -> DraDriver:
    """The driver of `nvdp dra-kubelet-plugin`: its settings resolved, logging set up. Raises
    NvdpError (one line): a bad setting, no kubeconfig."""
    settings = resolve_dra(args, environ)
    setup_logging(settings.runtime.log_format, settings.runtime.log_level)
    return DraDriver(settings, environ, reload=lambda: resolve_dra(args, environ))


@dataclass
class _ClaimSources:
    """What the claims' parts read of the driver (`nvdp.plugins.dra.claim_parts.DriverParts`): NVML, the API,
    the node's state, and the preparer once the loop has built it."""

    nvml: Nvml
    api: ResourceApi
    state: NodeState
    preparing: Preparing

    @property
    def preparer(self) -> ClaimPreparer | None:
        return self.preparing.preparer
