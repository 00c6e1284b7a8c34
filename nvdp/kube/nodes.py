"""The Node object: its labels, annotations and UID, and annotations written by merge patch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json, one_line, request, strings


@dataclass(frozen=True)
class NodeMeta:
    """What the config-manager reads of a Node: its labels and annotations."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> NodeMeta:
        metadata = obj.get("metadata") or {}
        return cls(strings(metadata.get("labels")), strings(metadata.get("annotations")))


def node_metadata(api_client: Any, node_name: str, *, timeout: float = 10.0) -> NodeMeta | None:
    """The labels and annotations of one Node (one GET); None when the Node does not exist. Raises
    KubeError."""
    try:
        node = get_json(api_client, f"/api/v1/nodes/{node_name}", {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read node {node_name}: {error}") from error
    except KubeError as error:
        raise KubeError(f"cannot read node {node_name}: {error}") from error
    return NodeMeta.of(node)


def patch_node_annotations(
    api_client: Any, node_name: str, annotations: Mapping[str, str | None], *, timeout: float = 10.0
) -> None:
    """Set annotations on a Node (None removes one) with a JSON merge patch: RBAC `nodes: patch`.
    Raises KubeError."""
    body = {"metadata": {"annotations": dict(annotations)}}
    path = f"/api/v1/nodes/{node_name}"
    try:
        request(
            api_client, "PATCH", path, {}, timeout, body=body, content_type="application/merge-patch+json"
        )
    except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
        raise KubeError(f"cannot annotate node {node_name}: {one_line(error)}") from error


def node_uid(api_client: Any, node_name: str, *, timeout: float = 10.0) -> str | None:
    """The UID of a Node (one GET): what an ownerReference to it names; None when the Node does not
    exist. Raises KubeError."""
    try:
        node = get_json(api_client, f"/api/v1/nodes/{node_name}", {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read node {node_name}: {error}") from error
    except KubeError as error:
        raise KubeError(f"cannot read node {node_name}: {error}") from error
    uid = (node.get("metadata") or {}).get("uid")
    return str(uid) if uid else None
