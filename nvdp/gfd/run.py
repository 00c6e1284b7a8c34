"""The `nvdp gfd` loop: label, publish, sleep on the interval (or a signal), repeat.

SIGHUP (`request_reload`) re-reads the configuration and labels at once; SIGTERM / SIGINT
(`request_stop`) end the loop, and the feature file is removed so stale labels do not outlive the
DaemonSet pod (NVIDIA's behaviour). `--oneshot` labels once and returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nvdp.errors import NvdpError
from nvdp.gfd.discover import discover, pci_mode
from nvdp.gfd.labels import TIMESTAMP_LABEL, Labels
from nvdp.gfd.options import GfdSettings
from nvdp.gfd.output import FileOutput, NodeFeatureOutput, Output
from nvdp.logs import log_event
from nvdp.nvml import open_nvml
from nvdp.nvml.types import Nvml

log = logging.getLogger(__name__)


class Gfd:
    def __init__(
        self,
        settings: GfdSettings,
        *,
        reload_settings: Callable[[], GfdSettings],
        output_factory: Callable[[GfdSettings, threading.Event], Output] | None = None,
        nvml_factory: Callable[[GfdSettings], Nvml] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._reload_settings = reload_settings
        self._output_factory = output_factory or default_output
        self._nvml_factory = nvml_factory or _open_nvml
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reload = False
        self.passes = 0

    # ---- signals (called from signal handlers: set flags only) ----------------------------------
    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def request_reload(self) -> None:
        self._reload = True
        self._wake.set()

    # ---- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        settings = self.settings
        output = self._output_factory(settings, self._stop)
        try:
            while True:
                self.label_once(settings, output)
                if settings.oneshot:
                    return
                self._wake.wait(settings.sleep_interval)
                self._wake.clear()
                if self._stop.is_set():
                    log_event(log, logging.INFO, "stopping")
                    return
                if self._reload:
                    self._reload = False
                    settings, output = self._apply_reload(settings, output)
        finally:
            if not settings.oneshot:
                output.remove()

    def _apply_reload(self, settings: GfdSettings, output: Output) -> tuple[GfdSettings, Output]:
        try:
            fresh = self._reload_settings()
        except NvdpError as error:
            log_event(
                log, logging.ERROR, "reload failed; keeping the current configuration", error=str(error)
            )
            return settings, output
        log_event(log, logging.INFO, "configuration reloaded", config=fresh.config.to_dict())
        if (fresh.output_file, fresh.use_node_feature_api) != (
            settings.output_file,
            settings.use_node_feature_api,
        ):
            output.remove()
            output = self._output_factory(fresh, self._stop)
        self.settings = fresh
        return fresh, output

    def label_once(self, settings: GfdSettings, output: Output) -> Labels:
        labels = self.compute(settings)
        if not settings.no_timestamp:
            labels[TIMESTAMP_LABEL] = str(int(self._clock()))
        output.write(labels)
        self.passes += 1
        return labels

    def compute(self, settings: GfdSettings) -> Labels:
        """This pass's labels (no timestamp). NVML init failures are fatal with fail-on-init-error,
        else logged and the node gets no labels but the timestamp (NVIDIA's behaviour)."""
        config = settings.config
        nvml = self._nvml_factory(settings)
        try:
            nvml.init()
        except NvdpError as error:
            if config.flags.fail_on_init_error:
                raise NvdpError(f"NVML init failed: {error}") from error
            log_event(log, logging.WARNING, "NVML init failed; no GPU labels", error=str(error))
            return {}
        try:
            real = config.nvml == "real"
            result = discover(
                nvml,
                config,
                machine_type_file=settings.machine_type_file,
                mode_of=(lambda g: pci_mode(g.pci_bus_id)) if real else None,
            )
        finally:
            nvml.shutdown()
        for warning in result.warnings:
            log_event(log, logging.WARNING, warning)
        return dict(result.labels)


def _open_nvml(settings: GfdSettings) -> Nvml:
    return open_nvml(settings.config.nvml, driver_root=settings.config.flags.nvidia_driver_root)


def default_output(settings: GfdSettings, stop: threading.Event) -> Output:
    if not settings.use_node_feature_api:
        return FileOutput(settings.output_file)
    from nvdp.kube import custom_objects_api

    kubeconfig = settings.kubeconfig or None
    return NodeFeatureOutput(
        settings.node_name,
        settings.namespace,
        api_factory=lambda: custom_objects_api(kubeconfig=kubeconfig),
        stop=stop,
    )
