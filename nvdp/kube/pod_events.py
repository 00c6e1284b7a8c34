"""Pod events: an Event on a Pod, in the pod's namespace, as the kubelet records its own pod events.

involvedObject is `{kind: Pod, namespace, name, uid, fieldPath: spec.containers{<container>}}`;
`kubectl describe pod` finds a pod's events by name, namespace, kind and UID, so an event without the
pod's UID (unknown) is listed by `kubectl get events` but not by describe. RBAC: `events: create` in
the pod's namespace, nothing on pods."""

from __future__ import annotations

import datetime
import time
from typing import Any

from nvdp.errors import KubeError
from nvdp.kube.client import new_api_client, one_line, request
from nvdp.kube.events import EVENT_SOURCE


class KubePodEvents:
    """Creates core/v1 Events on pods, recorded by this node's plugin (`node_name`), through a raw
    request (JSON), as `nvdp.kube.events.KubeNodeEvents` does. `api_client` injects one from
    `new_api_client`; else `host` (+ `token`) points at a server (tests), else the in-cluster
    configuration is loaded. Failures raise KubeError."""

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

    def event_body(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        container: str,
        event_type: str,
        reason: str,
        message: str,
    ) -> dict[str, Any]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, str] = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
        if uid:
            involved["uid"] = uid
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
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

    def create_pod_event(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        container: str,
        event_type: str,
        reason: str,
        message: str,
    ) -> None:
        body = self.event_body(namespace, name, uid, container, event_type, reason, message)
        try:
            request(
                self._api_client,
                "POST",
                f"/api/v1/namespaces/{namespace}/events",
                {},
                self._timeout,
                body=body,
            )
        except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot create event on pod {namespace}/{name}: {one_line(error)}") from error
