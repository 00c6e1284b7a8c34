"""The Node's conditions and taints: read in one GET; a condition written with a strategic merge patch
of `nodes/status`, the taints with a JSON merge patch of the Node.

- A condition merges into `status.conditions` by its `type`, so one patch sets (or, with the
  `$patch: delete` directive, removes) nvdp's condition and leaves the kubelet's and
  node-problem-detector's alone; it needs RBAC `nodes/status: patch` only.
- `spec.taints` has no merge key: the whole list is written with the resourceVersion it was read
  at, so a taint added in between is not lost (409 Conflict: read again and retry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvdp.base.errors import KubeError
from nvdp.kube.client import get_json, one_line, request

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NodeConditionsAndTaints:
    """What one GET of the Node says about its conditions and taints."""

    conditions: tuple[dict[str, Any], ...]
    taints: tuple[dict[str, Any], ...]
    resource_version: str

    def condition(self, condition_type: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == condition_type), None)

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeConditionsAndTaints:
        status, spec = node.get("status") or {}, node.get("spec") or {}
        return cls(
            tuple(c for c in status.get("conditions") or () if isinstance(c, dict)),
            tuple(t for t in spec.get("taints") or () if isinstance(t, dict)),
            str((node.get("metadata") or {}).get("resourceVersion") or ""),
        )


class KubeNodeStatus:
    """Reads and writes one Node's conditions and taints through an ApiClient from
    `nvdp.kube.new_api_client`. Every failure raises KubeError, one line naming the node and, for an
    error status, `HTTP <code>` (403 without the RBAC, 404 without the Node, 409 for a taint list
    changed since it was read)."""

    def __init__(self, node_name: str, *, api_client: Any, request_timeout: float = 10.0) -> None:
        self._api_client = api_client
        self._node = node_name
        self._timeout = request_timeout

    def read(self) -> NodeConditionsAndTaints:
        try:
            node = get_json(self._api_client, f"/api/v1/nodes/{self._node}", {}, self._timeout)
        except KubeError as error:
            raise KubeError(f"cannot read node {self._node}: {error}") from error
        return NodeConditionsAndTaints.of(node)

    def patch_condition(self, condition: Mapping[str, Any]) -> None:
        """Set one condition (merged by its `type`): RBAC `nodes/status: patch`."""
        body = {"status": {"conditions": [dict(condition)]}}
        self._patch(f"/api/v1/nodes/{self._node}/status", body, STRATEGIC_MERGE_PATCH, "set a condition on")

    def remove_condition(self, condition_type: str) -> None:
        """Remove one condition (a strategic merge patch's `$patch: delete` by its `type`): RBAC
        `nodes/status: patch`."""
        body = {"status": {"conditions": [{"type": condition_type, "$patch": "delete"}]}}
        path = f"/api/v1/nodes/{self._node}/status"
        self._patch(path, body, STRATEGIC_MERGE_PATCH, "remove a condition of")

    def replace_taints(self, taints: Sequence[Mapping[str, Any]], resource_version: str) -> None:
        """Write the whole taint list, if the Node is still at `resource_version`: RBAC `nodes: patch`."""
        body = {
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": [dict(t) for t in taints]},
        }
        self._patch(f"/api/v1/nodes/{self._node}", body, MERGE_PATCH, "taint")

    def _patch(self, path: str, body: object, content_type: str, what: str) -> None:
        try:
            request(self._api_client, "PATCH", path, {}, self._timeout, body=body, content_type=content_type)
        except Exception as error:  # an HTTP status, urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot {what} node {self._node}: {one_line(error)}") from error
