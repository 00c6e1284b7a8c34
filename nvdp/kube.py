"""Talking to the Kubernetes API server: the only importer of the `kubernetes` client.

A leaf adapter: it imports nothing of nvdp but `nvdp.errors`; its callers reach it through small
protocols of their own (e.g. `nvdp.health.node_events.NodeEventClient`). The client (tens of MB) is
imported lazily, inside the functions that need it, and only when a feature that talks to the API
server is on; importing this module costs nothing. A process that blocked `ssl`
(`nvdp.footprint.block_ssl`) lifts the block before it builds a client here.

One client constructor (`new_api_client`: a host for tests, a kubeconfig, or the in-cluster service
account) serves every user: the plugin's node events, gfd's NodeFeature, the config-manager's Node
watch. Requests go through the client's ApiClient untyped (JSON in, JSON out; `_request`), not the
typed APIs, whose models cost about 22 MB more RSS; API failures are one-line KubeErrors.

Node events: a health transition becomes an Event on the node's Node object, as the kubelet records
its own node events: namespace `default`, involvedObject `{kind: Node, name: <node>, uid: <node>}`
(the kubelet puts the node name in the uid; `kubectl describe node` looks events up both ways).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from nvdp.errors import KubeError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
NODE_EVENTS_NAMESPACE = "default"
EVENT_SOURCE = "nvidia-device-plugin"


def in_cluster(environ: Mapping[str, str], token_file: str = SERVICE_ACCOUNT_TOKEN) -> bool:
    """In-cluster credentials are present (KUBERNETES_SERVICE_HOST and the service-account token)."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(token_file)


def new_api_client(
    *, kubeconfig: str | None = None, host: str | None = None, token: str | None = None, retries: int = 1
) -> Any:
    """The one way this module builds a `kubernetes.client.ApiClient`: `host` (+ bearer `token`) points
    at a server directly (tests: a local stand-in); else the `kubeconfig` file (KUBECONFIG /
    --kubeconfig); else the in-cluster service account. `retries`: urllib3's own retries of a failed
    connection (0 where the caller retries with backoff). Raises KubeError (one line) when no
    configuration can be loaded. A process that blocked `ssl` lifts the block first."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if host is not None:
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": token}
            configuration.api_key_prefix = {"authorization": "Bearer"}
    else:
        if kubeconfig and not os.path.isfile(kubeconfig):
            raise KubeError(f"cannot load kubeconfig {kubeconfig}: no such file")
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


class KubeNodeEvents:
    """Creates core/v1 Events on one Node, through a raw request (JSON): the typed CoreV1Api costs
    about 22 MB more RSS (pydantic and its models). `api_client` injects one from `new_api_client`;
    else `host` (+ `token`) points at a server (tests), else the in-cluster configuration is loaded.
    Failures raise KubeError."""

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
        self._api_client = api_client if api_client is not None else new_api_client(host=host, token=token)
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
        body = self.event_body(event_type, reason, message)
        path = f"/api/v1/namespaces/{self._namespace}/events"
        try:
            _request(self._api_client, "POST", path, {}, self._timeout, body=body).release_conn()
        except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot create event on node {self._node}: {_one_line(error)}") from error


# ---- NodeFeature objects (nvdp gfd --use-node-feature-api) -------------------------------------

NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"
NODE_FEATURE_VERSION = "v1alpha1"
NODE_FEATURE_PLURAL = "nodefeatures"
NODE_FEATURE_NODE_LABEL = "nfd.node.kubernetes.io/node-name"


def node_feature_body(name: str, namespace: str, node: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A NodeFeature carrying `labels` for `node` (NFD merges it by the node-name label)."""
    return {
        "apiVersion": f"{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}",
        "kind": "NodeFeature",
        "metadata": {"name": name, "namespace": namespace, "labels": {NODE_FEATURE_NODE_LABEL: node}},
        "spec": {"features": {}, "labels": dict(labels)},
    }


def apply_node_feature(
    api_client: Any,
    namespace: str,
    name: str,
    node: str,
    labels: Mapping[str, str],
    timeout: float = 10.0,
    ignore: tuple[str, ...] = (),
) -> str:
    """Create the NodeFeature, or replace it when its labels differ. Returns "created", "updated"
    or "unchanged" (label keys in `ignore`, such as a timestamp, do not count as a change). API
    failures raise KubeError naming the object and the status."""
    collection = (
        f"/apis/{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}/namespaces/{namespace}/{NODE_FEATURE_PLURAL}"
    )
    body = node_feature_body(name, namespace, node, labels)
    where = f"NodeFeature {namespace}/{name}"

    def kept(found: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in found.items() if k not in ignore}

    try:
        try:
            current = _get_json(api_client, f"{collection}/{name}", {}, timeout)
        except _HttpError as error:
            if error.status != 404:
                raise
            _request(api_client, "POST", collection, {}, timeout, body=body).release_conn()
            return "created"
        metadata = current.get("metadata") or {}
        spec = current.get("spec") or {}
        if (
            kept(spec.get("labels") or {}) == kept(labels)
            and spec.get("features") == body["spec"]["features"]
            and metadata.get("labels") == body["metadata"]["labels"]
        ):
            return "unchanged"
        body["metadata"]["resourceVersion"] = metadata.get("resourceVersion")
        _request(api_client, "PUT", f"{collection}/{name}", {}, timeout, body=body).release_conn()
        return "updated"
    except _HttpError as error:
        raise KubeError(f"{where}: API error {error.status} {error.reason}".rstrip()) from error
    except Exception as error:  # urllib3 / socket errors: one line, not a traceback
        raise KubeError(f"{where}: cannot reach the API server: {_one_line(error)}") from error


# ---- config-manager: a list+watch of one Node ---------------------------------------------------


def node_labels(api_client: Any, node_name: str, *, timeout: float = 10.0) -> dict[str, str] | None:
    """The labels of one Node (one GET); None when the Node does not exist. Raises KubeError."""
    try:
        node = _get_json(api_client, f"/api/v1/nodes/{node_name}", {}, timeout)
    except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
        if isinstance(error, _HttpError) and error.status == 404:
            return None
        raise KubeError(f"cannot read node {node_name}: {_one_line(error)}") from error
    return _labels(node)


class NodeWatch:
    """List+watch one Node (field selector metadata.name=<node>) and hand its labels to `on_labels`
    (None when the Node is gone). Resumes from the last resourceVersion after the server ends a
    watch; re-lists on 410 Gone; retries every other failure with capped exponential backoff and
    never stops until `stop` is set. `on_failure(message, failing_for_seconds)` hears each failure;
    a line is logged at WARNING, and at ERROR once the watch has been failing for `alarm_after` s.
    Requests go through the client's ApiClient untyped (JSON), as everywhere here (module docstring).
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
        version: str | None = None
        delay = self._backoff_initial
        alarmed = False
        while not stop.is_set():
            try:
                if version is None:
                    nodes = _get_json(self._api_client, "/api/v1/nodes", {"fieldSelector": self.selector}, 30)
                    self.lists += 1
                    items = nodes.get("items") or []
                    self._on_labels(_labels(items[0]) if items else None)
                    version = str(nodes["metadata"]["resourceVersion"])
                    self._recovered()
                    delay, alarmed = self._backoff_initial, False
                version = self._watch(version, stop)
                self._recovered()
                delay, alarmed = self._backoff_initial, False
                continue
            except _Gone:
                log.info("node watch expired (410 Gone); listing again node=%s", self._node)
                version = None
                continue
            except _HttpError as error:
                message = str(error)
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

    def _watch(self, version: str, stop: threading.Event) -> str:
        """One watch request from `version` until the server ends it; the last version seen."""
        from kubernetes.watch.watch import iter_resp_lines

        query = {
            "fieldSelector": self.selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._timeout_seconds),
            "watch": "true",
        }
        response = _request(self._api_client, "GET", "/api/v1/nodes", query, (10, self._timeout_seconds + 30))
        try:
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise _HttpError(int(obj.get("code") or 0), str(obj.get("message") or obj))
                self._recovered()
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "DELETED":
                    self._on_labels(None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._on_labels(_labels(obj))
                if stop.is_set():
                    break
        finally:
            response.release_conn()
        return version

    def _recovered(self) -> None:
        if self.failing_since is not None:
            log.info(
                "node watch recovered node=%s after=%.1fs", self._node, time.monotonic() - self.failing_since
            )
            self.failing_since = None


class _HttpError(Exception):
    def __init__(self, status: int, detail: str, reason: str = "") -> None:
        self.status, self.reason = status, reason
        super().__init__(f"HTTP {status} {' '.join(detail.split())[:200]}")


class _Gone(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


def _request(
    api_client: Any,
    method: str,
    path: str,
    query: Mapping[str, str],
    timeout: float | tuple[float, float],
    body: object = None,
) -> Any:
    """One request through the client's ApiClient (auth, TLS, proxies from the kubeconfig); raises
    _HttpError (or _Gone) on a non-2xx answer. Returns the urllib3 response, body unread (`.data`
    reads it; `.stream()` follows a watch)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if hasattr(api_client, "param_serialize"):  # clients >= 34 (openapi-generator): no raise on non-2xx
        serialized = api_client.param_serialize(
            method,
            path,
            query_params=list(query.items()) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        method, url, headers, body = serialized[0], serialized[1], serialized[2], serialized[3]
        response = api_client.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout
        )
        raw = response.response
        if not 200 <= raw.status <= 299:
            raise _http_error(raw.status, raw.data, raw.reason)
        return raw
    from kubernetes.client.exceptions import ApiException  # older clients (swagger-codegen)

    try:
        return api_client.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=timeout,
        )
    except ApiException as error:
        raise _http_error(int(error.status or 0), error.body, error.reason) from error


def _http_error(status: int, body: object, reason: object) -> Exception:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        detail = json.loads(text).get("message") or reason
    except (ValueError, AttributeError):
        detail = text or reason
    return _Gone() if status == 410 else _HttpError(status, str(detail), str(reason or ""))


def _get_json(api_client: Any, path: str, query: Mapping[str, str], timeout: float) -> dict[str, Any]:
    data = json.loads(_request(api_client, "GET", path, query, timeout).data)
    if not isinstance(data, dict):
        raise _HttpError(200, f"unexpected answer from {path}")
    return data


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
