"""Talking to the Kubernetes API server: the only importer of the `kubernetes` client.

The client (tens of MB) is imported lazily, inside the functions that need it, and only when a
feature that talks to the API server is on; importing this module costs nothing.

Node events: a health transition becomes an Event on the node's Node object, as the kubelet records
its own node events: namespace `default`, involvedObject `{kind: Node, name: <node>, uid: <node>}`
(the kubelet puts the node name in the uid; `kubectl describe node` looks events up both ways).
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from nvdp.errors import KubeError
from nvdp.health.node_events import NodeEventRecorder

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
NODE_EVENTS_NAMESPACE = "default"
EVENT_SOURCE = "nvidia-device-plugin"


def in_cluster(environ: Mapping[str, str], token_file: str = SERVICE_ACCOUNT_TOKEN) -> bool:
    """In-cluster credentials are present (KUBERNETES_SERVICE_HOST and the service-account token)."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(token_file)


class KubeNodeEvents:
    """Creates core/v1 Events on one Node with the `kubernetes` client.

    `api_client` injects a ready `kubernetes.client.ApiClient`; else `host` (+ `token`) points at a
    server (tests: a local stub); else the in-cluster service-account configuration is loaded.
    """

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,
        host: str | None = None,
        token: str | None = None,
        namespace: str = NODE_EVENTS_NAMESPACE,
        component: str = EVENT_SOURCE,
        request_timeout: float = 5.0,
    ) -> None:
        from nvdp.footprint import allow_ssl

        allow_ssl()  # the plugin process blocks ssl until a TLS client is needed
        from kubernetes import client, config  # lazy: only when node events are on

        if api_client is None:
            configuration = client.Configuration()
            if host is not None:
                configuration.host = host
                if token:
                    configuration.api_key = {"authorization": token}
                    configuration.api_key_prefix = {"authorization": "Bearer"}
            else:
                config.load_incluster_config(client_configuration=configuration)
            configuration.retries = 1
            api_client = client.ApiClient(configuration)
        self._api = client.CoreV1Api(api_client)
        self._node = node_name
        self._namespace = namespace
        self._component = component
        self._timeout = request_timeout

    def event_body(self, event_type: str, reason: str, message: str) -> dict[str, Any]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self._node}.{time.time_ns():x}", "namespace": self._namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": self._node},
            "type": event_type,
            "reason": reason,
            "message": message,
            "source": {"component": self._component, "host": self._node},
            "reportingComponent": self._component,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def create_node_event(self, event_type: str, reason: str, message: str) -> None:
        self._api.create_namespaced_event(
            self._namespace, self.event_body(event_type, reason, message), _request_timeout=self._timeout
        )


def node_events_from_env(
    environ: Mapping[str, str], *, token_file: str = SERVICE_ACCOUNT_TOKEN, max_queue: int = 64
) -> NodeEventRecorder | None:
    """A recorder when NODE_NAME is set and in-cluster credentials exist; else None (feature off)."""
    node = environ.get("NODE_NAME", "")
    if not node or not in_cluster(environ, token_file):
        return None
    return NodeEventRecorder(lambda: KubeNodeEvents(node), max_queue=max_queue)


# ---- config-manager: the client from a kubeconfig, and a list+watch of one Node -----------------


def api_client_from(kubeconfig: str | None, *, retries: int = 0) -> Any:
    """A `kubernetes.client.ApiClient` from a kubeconfig file (KUBECONFIG / --kubeconfig), else from
    the in-cluster service account. Raises nvdp.errors.KubeError (one line) when neither works."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError) as error:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
        raise KubeError(f"cannot load {where}: {' '.join(str(error).split())}") from error
    configuration.retries = retries
    return client.ApiClient(configuration)


def node_labels(api_client: Any, node_name: str, *, timeout: float = 10.0) -> dict[str, str] | None:
    """The labels of one Node (one GET); None when the Node does not exist. Raises KubeError."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        node = CoreV1Api(api_client).read_node(node_name, _request_timeout=timeout)
    except ApiException as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read node {node_name}: HTTP {error.status} {error.reason}") from error
    except Exception as error:  # urllib3 / socket errors: one line, not a traceback
        raise KubeError(f"cannot read node {node_name}: {_one_line(error)}") from error
    return dict(node.metadata.labels or {})


class NodeWatch:
    """List+watch one Node (field selector metadata.name=<node>) and hand its labels to `on_labels`
    (None when the Node is gone). Resumes from the last resourceVersion after the server ends a
    watch; re-lists on 410 Gone; retries every other failure with capped exponential backoff and
    never stops until `stop` is set. `on_failure(message, failing_for_seconds)` hears each failure;
    a line is logged at WARNING, and at ERROR once the watch has been failing for `alarm_after` s.
    """

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        on_labels: Callable[[dict[str, str] | None], None],
        *,
        on_failure: Callable[[str, float], None] | None = None,
        timeout_seconds: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        alarm_after: float = 60.0,
    ) -> None:
        self._api_client = api_client
        self._node = node_name
        self._on_labels = on_labels
        self._on_failure = on_failure
        self._timeout_seconds = timeout_seconds
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._alarm_after = alarm_after
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.lists = 0  # full lists done (the first, and one after each 410 Gone)

    @property
    def selector(self) -> str:
        return f"metadata.name={self._node}"

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set (checked between requests and events)."""
        from kubernetes import watch
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        api = CoreV1Api(self._api_client)
        version: str | None = None
        delay = self._backoff_initial
        alarmed = False
        while not stop.is_set():
            try:
                if version is None:
                    nodes = api.list_node(field_selector=self.selector, _request_timeout=30)
                    self.lists += 1
                    self._on_labels(dict(nodes.items[0].metadata.labels or {}) if nodes.items else None)
                    version = nodes.metadata.resource_version
                    self._recovered()
                    delay, alarmed = self._backoff_initial, False
                stream = watch.Watch()
                for event in stream.stream(
                    api.list_node,
                    field_selector=self.selector,
                    resource_version=version,
                    timeout_seconds=self._timeout_seconds,
                    allow_watch_bookmarks=True,
                    _request_timeout=(10, self._timeout_seconds + 30),
                ):
                    self._recovered()
                    delay, alarmed = self._backoff_initial, False
                    kind = event["type"]
                    if kind == "DELETED":
                        self._on_labels(None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self._on_labels(dict(event["object"].metadata.labels or {}))
                    if stop.is_set():
                        stream.stop()
                        break
                version = stream.resource_version or version
                self._recovered()
                continue
            except ApiException as error:
                if error.status == 410:
                    log.info("node watch expired (410 Gone); listing again node=%s", self._node)
                    version = None
                    continue
                message = f"HTTP {error.status} {' '.join(str(error.reason).split())}"
            except Exception as error:  # connection refused, timeouts, bad answers: retry, never stop
                message = _one_line(error)
            now = time.monotonic()
            if self.failing_since is None:
                self.failing_since = now
            failing_for = now - self.failing_since
            if failing_for >= self._alarm_after and not alarmed:
                alarmed = True
                log.error(
                    "node watch has been failing node=%s for=%.0fs error=%r; the config is not following"
                    " the node label until it recovers",
                    self._node,
                    failing_for,
                    message,
                )
            else:
                log.warning("node watch failed node=%s error=%r retry_in=%.1fs", self._node, message, delay)
            if self._on_failure is not None:
                self._on_failure(message, failing_for)
            stop.wait(delay)
            delay = min(delay * 2, self._backoff_max)

    def _recovered(self) -> None:
        if self.failing_since is not None:
            log.info(
                "node watch recovered node=%s after=%.1fs", self._node, time.monotonic() - self.failing_since
            )
            self.failing_since = None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
