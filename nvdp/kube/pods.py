"""The pod this process runs in, read from the API server: the owner references of objects it writes
(NVIDIA's gfd: its DaemonSet as the controller, and the pod), so that Kubernetes' garbage collector
deletes them with the DaemonSet (`helm uninstall`) and not when one pod is replaced."""

from __future__ import annotations

from typing import Any

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json, one_line

OwnerReference = dict[str, Any]


def pod_owner_references(
    api_client: Any, namespace: str, pod_name: str, *, timeout: float = 10.0
) -> list[OwnerReference]:
    """[the pod's DaemonSet, as controller; the pod], from one GET of the pod (RBAC `pods: get`);
    [] when no DaemonSet owns the pod. Raises KubeError (KubeStatusError for an error status)."""
    try:
        pod = get_json(api_client, f"/api/v1/namespaces/{namespace}/pods/{pod_name}", {}, timeout)
    except KubeStatusError:
        raise
    except KubeError as error:
        raise KubeError(f"cannot read pod {namespace}/{pod_name}: {one_line(error)}") from error
    metadata = pod.get("metadata") or {}
    owners = metadata.get("ownerReferences") or []
    daemonset = next((o for o in owners if isinstance(o, dict) and o.get("kind") == "DaemonSet"), None)
    if daemonset is None:
        return []
    return [
        {
            "apiVersion": daemonset.get("apiVersion"),
            "kind": "DaemonSet",
            "name": daemonset.get("name"),
            "uid": daemonset.get("uid"),
            "controller": True,
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata.get("name", pod_name),
            "uid": metadata.get("uid"),
        },
    ]
