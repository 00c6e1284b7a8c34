"""Running `nvdp config-manager`: the Kubernetes client, the Node watch thread (and with
--configmap-name the ConfigMap watch thread), the record of the applied entry on the Node (removed
when the release is uninstalled), and the loop.

The CLI (nvdp/cli.py) parses, prints and installs signal handlers; this module does the work.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from nvdp import kube
from nvdp.base.errors import KubeError
from nvdp.base.logs import log_event
from nvdp.kube.configmaps import ConfigMapData, read_configmap
from nvdp.kube.reflector import WatchTimers
from nvdp.plugins.uninstall import Release
from nvdp.side.configmanager.manager import ConfigManager
from nvdp.side.configmanager.object_watch import ConfigMapWatch, NodeWatch, ObjectWatch
from nvdp.side.configmanager.settings import APPLIED_ANNOTATION, Settings
from nvdp.side.configmanager.spread import Spread
from nvdp.side.configmanager.status import Snapshot, StatusServer, failing_for

log = logging.getLogger(__name__)

EVENT_COMPONENT = "nvidia-device-plugin-config-manager"
ALARM_AFTER = WatchTimers.alarm_after_s  # seconds of failing watch: the ERROR line and /readyz 503


class NodeAnnotationRecord:
    """Records the entry put in place as the Node's APPLIED_ANNOTATION (RBAC: nodes patch)."""

    def __init__(self, client: object, node_name: str) -> None:
        self._client, self._node = client, node_name

    def write(self, entry: str) -> None:
        kube.patch_node_annotations(self._client, self._node, {APPLIED_ANNOTATION: entry})


def remove_record(client: object, node_name: str, timeout: float) -> None:
    """The release is uninstalled: the annotation leaves the Node (said; a failure is one WARNING)."""
    try:
        kube.patch_node_annotations(client, node_name, {APPLIED_ANNOTATION: None}, timeout=timeout)
    except KubeError as error:
        log_event(
            log,
            logging.WARNING,
            "node annotation not removed at uninstall; remove it by hand",
            annotation=APPLIED_ANNOTATION,
            error=str(error),
        )
        return
    log_event(log, logging.INFO, "node annotation removed", annotation=APPLIED_ANNOTATION)


def connect(settings: Settings) -> tuple[object, ConfigManager]:
    """The API client and a manager that records Events and the applied entry on the Node. Raises
    KubeError."""
    client = kube.new_api_client(kubeconfig=settings.kubeconfig)
    events = kube.KubeEvents(settings.node_name, api_client=client, component=EVENT_COMPONENT)
    return client, ConfigManager(settings, events, NodeAnnotationRecord(client, settings.node_name))


def oneshot(settings: Settings) -> int:
    """Read the Node once, apply, exit: 0 when a config is in place, 1 otherwise. Without the API
    server there is no label to follow: exit 1 (the kubelet retries the init container) rather than
    a guess that could shrink the node."""
    client, manager = connect(settings)
    _set_node(manager, kube.node_metadata(client, settings.node_name))
    if settings.configmap_name:  # the ConfigMap now, where the API serves it; else the mount
        try:
            manager.sources.set_api(read_configmap(client, settings.namespace, settings.configmap_name), True)
        except KubeError as error:
            log_event(
                log,
                logging.WARNING,
                "cannot read the ConfigMap from the API; using its mounted copy",
                error=str(error),
            )
            manager.sources.api_failed()
    outcome = manager.reconcile()
    return 0 if outcome.entry is not None else 1


def _set_node(manager: ConfigManager, node: kube.NodeMeta | None) -> None:
    manager.set_labels(None if node is None else node.labels, None if node is None else node.annotations)


def serve(
    settings: Settings,
    stop: threading.Event,
    manager_ready: list[ConfigManager] | None = None,
    release: Release | None = None,
) -> int:
    """Watch the Node and reconcile until `stop` is set; then, when `release` says the pod's
    DaemonSet goes (an uninstall, not a restart), remove the Node annotation."""
    _, manager = connect(settings)
    if manager_ready is not None:
        manager_ready.append(manager)
    # The watch's own client makes no retries: it retries with backoff, and a retry of a request
    # stalled before its headers would double the time its silence takes to be noticed.
    watch_client = kube.new_api_client(kubeconfig=settings.kubeconfig, retries=0)
    watch = NodeWatch(watch_client, settings.node_name, lambda node: _set_node(manager, node))
    configmap_watch = None
    spread: Spread[ConfigMapData | None] | None = None
    if settings.configmap_name:
        spread = Spread(manager.sources.set_api, settings.configmap_spread)
        configmap_watch = ConfigMapWatch(
            watch_client,
            settings.namespace,
            settings.configmap_name,
            spread,
            on_failure=manager.sources.api_failed,
            on_recovered=manager.sources.api_recovered,
        )
    status = None
    if settings.metrics_address:

        def snapshot() -> Snapshot:
            return Snapshot(
                applied=manager.entry is not None,
                applied_total=manager.applied_total,
                refused_total=manager.refused_total,
                signals_total=manager.signals_sent,
                watch_failing_for=failing_for(watch.failing_since),
                retrying=manager.retrying,
                configmap_watch_failing_for=failing_for(
                    configmap_watch.failing_since if configmap_watch else None
                ),
                watch_error=watch.last_error,
                configmap_watch_error=configmap_watch.last_error if configmap_watch else "",
            )

        status = StatusServer(settings.metrics_address, snapshot, ALARM_AFTER).start()
    threads = [threading.Thread(target=_watch, args=(watch, stop), name="node-watch", daemon=True)]
    if configmap_watch is not None:
        threads.append(
            threading.Thread(target=_watch, args=(configmap_watch, stop), name="configmap-watch", daemon=True)
        )
    log_event(
        log,
        logging.INFO,
        "watching node label",
        node=settings.node_name,
        label=settings.node_label,
        srcdir=settings.config_file_srcdir,
        dst=settings.config_file_dst,
        configmap=manager.sources.configmap or None,
    )
    for thread in threads:
        thread.start()
    try:
        manager.run(stop)
    finally:
        if spread is not None:
            spread.close()
        if status is not None:
            status.stop()
    if release is not None and release.removed():
        remove_record(release.api_client, settings.node_name, release.timeout)
    return 0


def _watch(watch: ObjectWatch[Any], stop: threading.Event) -> None:
    try:
        watch.run(stop)
    except BaseException as error:  # ObjectWatch.run never returns early; if it did, say so loudly
        log_event(log, logging.ERROR, f"{watch.kind} watch ended", error=str(error))
        raise


__all__ = ["KubeError", "connect", "oneshot", "serve"]
