"""NodeFeature objects (`nvdp gfd --use-node-feature-api`): Node Feature Discovery's API for labels,
written with the owner references the caller gives (`nvdp.kube.pods`), and whether a server serves it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json, one_line, request

NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"

NODE_FEATURE_VERSION = "v1alpha1"

NODE_FEATURE_PLURAL = "nodefeatures"

NODE_FEATURE_NODE_LABEL = "nfd.node.kubernetes.io/node-name"


def node_feature_body(
    name: str,
    namespace: str,
    node: str,
    labels: Mapping[str, str],
    owners: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A NodeFeature carrying `labels` for `node` (NFD merges it by the node-name label), owned by
    `owners` (none: no ownerReferences, as NVIDIA writes it then)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {NODE_FEATURE_NODE_LABEL: node},
    }
    if owners:
        metadata["ownerReferences"] = [dict(owner) for owner in owners]
    return {
        "apiVersion": f"{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}",
        "kind": "NodeFeature",
        "metadata": metadata,
        "spec": {"features": {}, "labels": dict(labels)},
    }


def node_feature_api_served(api_client: Any, timeout: float = 10.0) -> bool:
    """The API server serves NodeFeature objects (NFD's CRD is installed): one discovery GET of
    /apis/nfd.k8s-sigs.io/v1alpha1. Raises KubeError when the server cannot be asked."""
    try:
        found = get_json(api_client, f"/apis/{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}", {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return False
        raise KubeError(f"API discovery: API error {error.status} {error.reason}".rstrip()) from error
    resources = found.get("resources") or []
    return any(isinstance(r, dict) and r.get("name") == NODE_FEATURE_PLURAL for r in resources)


def apply_node_feature(
    api_client: Any,
    namespace: str,
    name: str,
    node: str,
    labels: Mapping[str, str],
    timeout: float = 10.0,
    ignore: tuple[str, ...] = (),
    owners: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Create the NodeFeature, or replace it when its labels or owner references differ (its owners
    become `owners`, as NVIDIA's gfd sets them). Returns "created", "updated" or "unchanged" (label
    keys in `ignore`, such as a timestamp, do not count as a change). API failures raise KubeError
    naming the object and the status."""
    collection = (
        f"/apis/{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}/namespaces/{namespace}/{NODE_FEATURE_PLURAL}"
    )
    body = node_feature_body(name, namespace, node, labels, owners)
    where = f"NodeFeature {namespace}/{name}"

    def kept(found: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in found.items() if k not in ignore}

    try:
        try:
            current = get_json(api_client, f"{collection}/{name}", {}, timeout)
        except KubeStatusError as error:
            if error.status != 404:
                raise
            request(api_client, "POST", collection, {}, timeout, body=body)
            return "created"
        metadata = current.get("metadata") or {}
        spec = current.get("spec") or {}
        if (
            kept(spec.get("labels") or {}) == kept(labels)
            and spec.get("features") == body["spec"]["features"]
            and metadata.get("labels") == body["metadata"]["labels"]
            and (metadata.get("ownerReferences") or []) == body["metadata"].get("ownerReferences", [])
        ):
            return "unchanged"
        body["metadata"]["resourceVersion"] = metadata.get("resourceVersion")
        request(api_client, "PUT", f"{collection}/{name}", {}, timeout, body=body)
        return "updated"
    except KubeStatusError as error:
        raise KubeError(f"{where}: API error {error.status} {error.reason}".rstrip()) from error
    except Exception as error:  # urllib3 / socket errors: one line, not a traceback
        raise KubeError(f"{where}: cannot reach the API server: {one_line(error)}") from error
