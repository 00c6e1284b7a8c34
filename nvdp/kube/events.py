"""Events: a core/v1 Event on any object, recorded by this node's nvdp, as the kubelet records its own.

- A Node's: namespace `default`, involvedObject `{kind: Node, name: <node>, uid: <node>}` (the
  kubelet puts the node name in the uid; `kubectl describe node` looks events up both ways).
- A Pod's: the pod's namespace, involvedObject `{kind: Pod, namespace, name, uid, fieldPath:
  spec.containers{<container>}}`; `kubectl describe pod` finds a pod's events by name, namespace,
  kind and UID, so an event without the pod's UID (unknown) is listed by `kubectl get events` but
  not by describe. RBAC: `events: create` in the pod's namespace, nothing on pods.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

from nvdp.base.errors import KubeError
from nvdp.kube.client import new_api_client, one_line, request

NODE_EVENTS_NAMESPACE = "default"  # where a cluster-scoped object's events go

EVENT_SOURCE = "nvidia-device-plugin"


@dataclass(frozen=True)
class Involved:
    """The object an Event is about (its involvedObject); `namespace` "" for a cluster-scoped one."""

    kind: str
    name: str
    namespace: str = ""
    uid: str | None = None
    field_path: str = ""

    @classmethod
    def node(cls, name: str) -> Involved:
        return cls("Node", name, uid=name)

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str | None, container: str = "") -> Involved:
        return cls("Pod", name, namespace, uid, f"spec.containers{{{container}}}" if container else "")

    def as_json(self) -> dict[str, str]:
        out = {"apiVersion": "v1", "kind": self.kind}
        if self.namespace:
            out["namespace"] = self.namespace
        out["name"] = self.name
        if self.uid:
            out["uid"] = self.uid
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind.lower()} {where}{self.name}"


class KubeEvents:
    """Creates core/v1 Events recorded by this node's plugin (`node_name`), through a raw request
    (JSON): the typed CoreV1Api costs about 22 MB more RSS (pydantic and its models). `api_client`
    injects one from `new_api_client`; else `host` (+ `token`) points at a server (tests), else the
    in-cluster configuration is loaded. Failures raise KubeError."""

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,
        host: str | None = None,
        token: str | None = None,
        component: str = EVENT_SOURCE,
        request_timeout: float = 5.0,
    ) -> None:
        self._api_client = api_client if api_client is not None else new_api_client(host=host, token=token)
        self._node = node_name
        self._component = component
        self._timeout = request_timeout

    def event_body(self, about: Involved, event_type: str, reason: str, message: str) -> dict[str, Any]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = about.namespace or NODE_EVENTS_NAMESPACE
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{about.name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": about.as_json(),
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

    def create_event(self, about: Involved, event_type: str, reason: str, message: str) -> None:
        body = self.event_body(about, event_type, reason, message)
        path = f"/api/v1/namespaces/{body['metadata']['namespace']}/events"
        try:
            request(self._api_client, "POST", path, {}, self._timeout, body=body)
        except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot create event on {about}: {one_line(error)}") from error
