"""Talking to the Kubernetes API server: the only importer of the `kubernetes` client.

A leaf adapter: it imports nothing of nvdp but `nvdp.errors`; its callers reach it through small
protocols of their own (e.g. `nvdp.health.node_events.NodeEventClient`). The client (tens of MB) is
imported lazily, inside the functions that need it, and only when a feature that talks to the API
server is on; importing this module costs nothing. A process that blocked `ssl`
(`nvdp.footprint.block_ssl`) lifts the block before it builds a client here.

Node events: a health transition becomes an Event on the node's Node object, as the kubelet records
its own node events: namespace `default`, involvedObject `{kind: Node, name: <node>, uid: <node>}`
(the kubelet puts the node name in the uid; `kubectl describe node` looks events up both ways).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

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


# ---- NodeFeature objects (nvdp gfd --use-node-feature-api) -------------------------------------

NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"
NODE_FEATURE_VERSION = "v1alpha1"
NODE_FEATURE_PLURAL = "nodefeatures"
NODE_FEATURE_NODE_LABEL = "nfd.node.kubernetes.io/node-name"


def custom_objects_api(*, host: str | None = None, kubeconfig: str | None = None) -> Any:
    """A `CustomObjectsApi`: `host` (tests), else `kubeconfig` (KUBECONFIG), else in-cluster.
    A process that blocked `ssl` lifts the block first (`nvdp.footprint.allow_ssl`)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if host is not None:
        configuration.host = host
    elif kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = 0  # the caller retries with backoff
    return client.CustomObjectsApi(client.ApiClient(configuration))


def node_feature_body(name: str, namespace: str, node: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A NodeFeature carrying `labels` for `node` (NFD merges it by the node-name label)."""
    return {
        "apiVersion": f"{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}",
        "kind": "NodeFeature",
        "metadata": {"name": name, "namespace": namespace, "labels": {NODE_FEATURE_NODE_LABEL: node}},
        "spec": {"features": {}, "labels": dict(labels)},
    }


def apply_node_feature(
    api: Any,
    namespace: str,
    name: str,
    node: str,
    labels: Mapping[str, str],
    timeout: float = 10.0,
    ignore: tuple[str, ...] = (),
) -> str:
    """Create the NodeFeature, or replace it when its labels differ. Returns "created", "updated"
    or "unchanged" (label keys in `ignore`, such as a timestamp, do not count as a change). API
    failures raise NvdpError naming the object and the status."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from nvdp.errors import NvdpError

    args = (NODE_FEATURE_GROUP, NODE_FEATURE_VERSION, namespace, NODE_FEATURE_PLURAL)
    body = node_feature_body(name, namespace, node, labels)
    where = f"NodeFeature {namespace}/{name}"
    try:
        try:
            current = api.get_namespaced_custom_object(*args, name, _request_timeout=timeout)
        except ApiException as error:
            if error.status != 404:
                raise
            api.create_namespaced_custom_object(*args, body, _request_timeout=timeout)
            return "created"
        metadata = current.get("metadata", {})
        spec = current.get("spec") or {}

        def kept(found: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in found.items() if k not in ignore}

        if (
            kept(spec.get("labels") or {}) == kept(labels)
            and spec.get("features") == body["spec"]["features"]
            and metadata.get("labels") == body["metadata"]["labels"]
        ):
            return "unchanged"
        body["metadata"]["resourceVersion"] = metadata.get("resourceVersion")
        api.replace_namespaced_custom_object(*args, name, body, _request_timeout=timeout)
        return "updated"
    except ApiException as error:
        raise NvdpError(f"{where}: API error {error.status} {error.reason}".rstrip()) from error
    except (HTTPError, OSError) as error:
        raise NvdpError(f"{where}: cannot reach the API server: {error}") from error
