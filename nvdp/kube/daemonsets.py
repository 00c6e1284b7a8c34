"""Whether the DaemonSet that owns this process's pod is gone: what tells an uninstall (the DaemonSet
deleted, then its pods get SIGTERM) from a restart, a rolling update or a node drain (the DaemonSet
stays); and a DaemonSet deleted in the foreground (its pods first), waited for while it is there."""

from __future__ import annotations

from typing import Any

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json, one_line, request

FOREGROUND = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}


def owner_daemonset_removed(api_client: Any, namespace: str, pod_name: str, *, timeout: float) -> bool:
    """True when the DaemonSet that owns pod `namespace/pod_name` is gone, is being deleted (it has a
    deletionTimestamp: a foreground deletion) or is another object of the same name (another UID);
    False while it stands, or when no DaemonSet owns the pod. Two GETs (RBAC `pods: get`,
    `daemonsets: get` in the namespace). Raises KubeError (one line)."""
    pod_path = f"/api/v1/namespaces/{namespace}/pods/{pod_name}"
    pod = _get(api_client, pod_path, f"pod {namespace}/{pod_name}", timeout)
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    owner = next((o for o in owners if isinstance(o, dict) and o.get("kind") == "DaemonSet"), None)
    if owner is None or not owner.get("name"):
        return False
    name = str(owner["name"])
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    try:
        daemonset = get_json(api_client, path, {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return True
        raise KubeError(f"cannot read daemonset {namespace}/{name}: {error}") from error
    except KubeError as error:
        raise KubeError(f"cannot read daemonset {namespace}/{name}: {one_line(error)}") from error
    metadata = daemonset.get("metadata") or {}
    return bool(metadata.get("deletionTimestamp")) or metadata.get("uid") != owner.get("uid")


def delete_daemonset(api_client: Any, namespace: str, name: str, *, timeout: float) -> bool:
    """Delete a DaemonSet in the foreground: it stays, with a deletionTimestamp, until the garbage
    collector deleted its pods (each after its grace period). False when there is none. RBAC
    `daemonsets: delete`. Raises KubeError (one line)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    try:
        request(api_client, "DELETE", path, {}, timeout, body=FOREGROUND)
    except KubeStatusError as error:
        if error.status == 404:
            return False
        raise KubeError(f"cannot delete daemonset {namespace}/{name}: {error}") from error
    except Exception as error:  # urllib3 / socket errors
        raise KubeError(f"cannot delete daemonset {namespace}/{name}: {one_line(error)}") from error
    return True


def daemonset_exists(api_client: Any, namespace: str, name: str, *, timeout: float) -> bool:
    """One GET (RBAC `daemonsets: get`). Raises KubeError (one line)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    try:
        get_json(api_client, path, {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return False
        raise KubeError(f"cannot read daemonset {namespace}/{name}: {error}") from error
    except KubeError as error:
        raise KubeError(f"cannot read daemonset {namespace}/{name}: {one_line(error)}") from error
    return True


def _get(api_client: Any, path: str, what: str, timeout: float) -> dict[str, Any]:
    try:
        return get_json(api_client, path, {}, timeout)
    except KubeError as error:
        raise KubeError(f"cannot read {what}: {one_line(error)}") from error
