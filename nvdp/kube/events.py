"""Node events: an Event on the node's Node object, as the kubelet records its own node events:
namespace `default`, involvedObject `{kind: Node, name: <node>, uid: <node>}` (the kubelet puts the
node name in the uid; `kubectl describe node` looks events up both ways)."""

from __future__ import annotations

import datetime
import time
from typing import Any

from nvdp.errors import KubeError
from nvdp.kube.client import new_api_client, one_line, request

NODE_EVENTS_NAMESPACE = "default"

EVENT_SOURCE = "nvidia-device-plugin"


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
            request(self._api_client, "POST", path, {}, self._timeout, body=body)
        except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot create event on node {self._node}: {one_line(error)}") from error
