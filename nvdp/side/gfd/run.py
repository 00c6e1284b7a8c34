"""The `nvdp gfd` loop: label, publish, sleep on the interval (or a signal), repeat.

- SIGHUP (`request_reload`) re-reads the config and labels at once; SIGTERM / SIGINT
  (`request_stop`) end the loop and remove the feature file.
- `--oneshot` labels once and returns; `--sleep-interval infinite` labels once and sleeps; both
  keep the labels at exit, as NVIDIA's gfd does (`keeps_labels_at_exit`).
- A misfit is one WARNING and one Node event when it first appears (`nvdp.node.gpus.misfit_report`).
- A failed publish keeps the last labels: one ERROR when it starts failing, a retry each pass (at
  least every minute), one INFO when it works again; only `--oneshot` exits 1.
- `--device-discovery-strategy vfio` is accepted, said in one line, and NVML's view labelled.
"""

from __future__ import annotations

import logging
import math
import os
import select
import time
from collections.abc import Callable, Mapping
from typing import Any

from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.health.node_events import NodeEventRecorder, node_events_from_env
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import Nvml
from nvdp.side.gfd.discover import discover, pci_mode
from nvdp.side.gfd.labels import TIMESTAMP_LABEL, Labels
from nvdp.side.gfd.options import GfdSettings
from nvdp.side.gfd.output import FileOutput, NodeFeatureOutput, Output

log = logging.getLogger(__name__)

Sleep = Callable[[float], bool]  # sleep up to N seconds; True when a stop was requested
MISFIT_SOURCE = "labels"
EVENT_COMPONENT = "gpu-feature-discovery"  # the Node events' source, NVIDIA's binary name
EVENTS_CLOSE_TIMEOUT_S = 5.0  # on exit, time to send the Node events still queued
PUBLISH_RETRY_S = 60.0  # labels that failed to publish are tried again after at most this
VFIO_NOTICE = (
    "--device-discovery-strategy vfio: nvdp cannot discover GPUs passed through to virtual machines "
    "(vfio-pci); labelling the GPUs NVML shows"
)


class Waker:
    """Sleep until a timeout or a `wake()` from another thread (nvdp.base.signals' dispatcher): flags
    and a byte written to a pipe that the sleeper waits on with select(); no lock is taken."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.stopping = False
        self.reload_requested = False

    def wake(self) -> None:
        try:
            os.write(self._write, b"x")
        except (BlockingIOError, OSError):
            pass  # a full pipe already wakes the sleeper; a closed one has nobody to wake

    def sleep(self, timeout: float) -> bool:
        """Sleep `timeout` s (math.inf: until woken); True when a stop was requested."""
        if not self.stopping:
            select.select([self._read], [], [], None if timeout == math.inf else timeout)
            try:
                while os.read(self._read, 512):
                    pass
            except (BlockingIOError, OSError):
                pass
        return self.stopping

    def close(self) -> None:
        fds, (self._read, self._write) = (self._read, self._write), (-1, -1)
        for fd in fds:  # -1 from now on: a late wake() must not write into a reused descriptor
            try:
                os.close(fd)
            except OSError:
                pass


class Gfd:
    def __init__(
        self,
        settings: GfdSettings,
        *,
        reload_settings: Callable[[], GfdSettings],
        output_factory: Callable[[GfdSettings, Sleep], Output] | None = None,
        nvml_factory: Callable[[GfdSettings], Nvml] | None = None,
        events_factory: Callable[[GfdSettings], NodeEventRecorder | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._reload_settings = reload_settings
        self._output_factory = output_factory or default_output
        self._nvml_factory = nvml_factory or _open_nvml
        self._clock = clock
        self._waker = Waker()
        self._output: Output | None = None  # while run() labels
        self.passes = 0
        self._events = (events_factory or default_events)(settings)
        self.misfits = MisfitReport(self._events)
        self._warned: frozenset[str] = frozenset()  # the last pass's warnings, logged once
        self.publish_error: str | None = None  # why the last labels were not published, if they were not

    # ---- requests from other threads (nvdp.base.signals' dispatcher, tests): flags and a pipe write ----
    def request_stop(self) -> None:
        self._waker.stopping = True
        self._waker.wake()

    def request_reload(self) -> bool:
        """Ask for a reload; True when that made one pending (False: one already was)."""
        newly = not self._waker.reload_requested
        self._waker.reload_requested = True
        self._waker.wake()
        return newly

    def abandon(self) -> None:
        """The stop did not finish (a labelling pass is blocked): remove the labels now, as the
        stop would have, so that they do not outlive the process. Any thread."""
        output = self._output
        if output is not None and not keeps_labels_at_exit(self.settings):
            output.remove()

    # ---- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        settings = self.settings
        waker = self._waker
        if settings.config.flags.device_discovery_strategy == "vfio":
            log_event(log, logging.WARNING, VFIO_NOTICE)
        output = self._output = self._output_factory(settings, waker.sleep)
        try:
            while True:
                self.label_once(settings, output)
                if settings.oneshot:
                    return
                if settings.sleep_interval == math.inf and self.publish_error is None:
                    log_event(
                        log, logging.INFO, "labelled; sleeping until a signal (--sleep-interval infinite)"
                    )
                if waker.sleep(self._until_next_pass(settings)):
                    log_event(log, logging.INFO, "stopping")
                    return
                if waker.reload_requested:
                    waker.reload_requested = False
                    settings, output = self._apply_reload(settings, output)
        finally:
            if not keeps_labels_at_exit(settings):
                output.remove()
            waker.close()
            if self._events is not None:
                self._events.close(timeout=EVENTS_CLOSE_TIMEOUT_S)

    def _until_next_pass(self, settings: GfdSettings) -> float:
        """The interval; at most PUBLISH_RETRY_S while the labels are not published."""
        interval = settings.sleep_interval
        return min(interval, PUBLISH_RETRY_S) if self.publish_error is not None else interval

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
            output = self._output = self._output_factory(fresh, self._waker.sleep)
        self.settings = fresh
        return fresh, output

    def label_once(self, settings: GfdSettings, output: Output) -> Labels:
        labels = self.compute(settings)
        if not settings.no_timestamp:
            labels[TIMESTAMP_LABEL] = str(int(self._clock()))
        self._publish(settings, output, labels)
        self.passes += 1
        return labels

    def _publish(self, settings: GfdSettings, output: Output, labels: Labels) -> None:
        """Write the labels; when that fails, the last published ones stay (the output replaces them
        atomically or not at all) and the next pass tries again. One line when publishing starts
        failing (or fails for another reason), one when it works again; `--oneshot` raises."""
        try:
            output.write(labels)
        except NvdpError as error:
            if settings.oneshot:
                raise
            if str(error) != self.publish_error:
                retry = min(settings.sleep_interval, PUBLISH_RETRY_S)
                log_event(
                    log, logging.ERROR, "labels not published; the last published labels stay, retrying "
                    "each pass", error=str(error), retry_in=f"{retry:g}s",
                )  # fmt: skip
            self.publish_error = str(error)
            return
        if self.publish_error is not None:
            log_event(log, logging.INFO, "labels published again")
            self.publish_error = None

    def compute(self, settings: GfdSettings) -> Labels:
        """This pass's labels (no timestamp). NVML init failures are fatal with fail-on-init-error,
        else logged and the node gets no labels but the timestamp (NVIDIA's behaviour)."""
        config = settings.config
        nvml = self._nvml_factory(settings)
        try:
            nvml.init()
        except NvdpError as error:
            if config.flags.fail_on_init_error and config.flags.device_discovery_strategy != "vfio":
                raise NvdpError(f"NVML init failed: {error}") from error
            log_event(log, logging.WARNING, "NVML init failed; no GPU labels", error=str(error))
            return {}
        try:
            real = settings.runtime.nvml == "real"
            result = discover(
                nvml,
                config,
                machine_type_file=settings.machine_type_file,
                mode_of=(lambda g: pci_mode(g.pci_bus_id)) if real else None,
            )
        finally:
            nvml.shutdown()
        for warning in result.warnings:
            if warning not in self._warned:
                log_event(log, logging.WARNING, warning)
        self._warned = frozenset(result.warnings)
        self.misfits.update(MISFIT_SOURCE, result.misfits)
        return dict(result.labels)


def keeps_labels_at_exit(settings: GfdSettings) -> bool:
    """Whether the labels stay when the process ends: with `--oneshot` and with `--sleep-interval
    infinite` (labels written once, by a Job or a pod that is meant to label and wait), as NVIDIA's
    gfd keeps them. A NodeFeature object always stays (`NodeFeatureOutput.remove`)."""
    return settings.oneshot or settings.sleep_interval == math.inf


def _open_nvml(settings: GfdSettings) -> Nvml:
    flags = settings.config.flags
    return open_nvml(settings.runtime.nvml, flags.nvidia_driver_root, flags.plugin.container_driver_root)


def default_events(
    settings: GfdSettings, environ: Mapping[str, str] = os.environ
) -> NodeEventRecorder | None:
    """Node events for misfits where the API server is reachable: the node's name (NODE_NAME /
    --node-name) and a kubeconfig or in-cluster credentials (in `environ`); else None."""
    return node_events_from_env(
        environ, node=settings.node_name, kubeconfig=settings.kubeconfig, component=EVENT_COMPONENT
    )


def default_output(settings: GfdSettings, sleep: Sleep, environ: Mapping[str, str] = os.environ) -> Output:
    """The NodeFeature object where --use-node-feature-api says so (unset: where `node_feature_api`
    finds it served), else the feature file."""
    use_api = settings.use_node_feature_api
    if use_api is None:
        use_api = node_feature_api(settings, environ)
    if not use_api:
        return FileOutput(settings.output_file)
    return NodeFeatureOutput(
        settings.node_name,
        settings.namespace,
        api_factory=_api_factory(settings),
        pod_name=settings.pod_name,
        sleep=sleep,
    )


def _api_factory(settings: GfdSettings) -> Callable[[], Any]:
    from nvdp.kube import new_api_client

    kubeconfig = settings.kubeconfig or None
    return lambda: new_api_client(kubeconfig=kubeconfig, retries=0)  # the output retries


def node_feature_api(settings: GfdSettings, environ: Mapping[str, str]) -> bool:
    """NVIDIA's default (--use-node-feature-api true) where it can work: a node name, a namespace,
    credentials (a kubeconfig, or in the cluster) and an API server that serves NodeFeature objects;
    else the feature file, which NFD reads without any of them. One INFO line says which and why."""
    from nvdp.kube import in_cluster, node_feature_api_served

    reason = ""
    if not settings.node_name or not settings.namespace:
        reason = "no node name (--node-name / NODE_NAME) or namespace"
    elif not settings.kubeconfig and not in_cluster(environ):
        reason = "no API server: no kubeconfig and not in a cluster"
    else:
        try:
            if not node_feature_api_served(_api_factory(settings)()):
                reason = "the API server serves no nfd.k8s-sigs.io/v1alpha1 NodeFeature objects"
        except NvdpError as error:
            reason = f"the API server cannot be asked: {error}"
    if reason:
        log_event(
            log, logging.INFO, "labels go to the feature file (--use-node-feature-api unset)",
            reason=reason, file=settings.output_file or "stdout",
        )  # fmt: skip
        return False
    log_event(
        log, logging.INFO, "labels go to a NodeFeature object (--use-node-feature-api unset: NVIDIA's true)"
    )
    return True
