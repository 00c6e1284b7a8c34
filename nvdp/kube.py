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
