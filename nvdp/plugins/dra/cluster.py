"""The API server as the DRA driver sees it: its ResourceSlices and ResourceClaims in the version of
resource.k8s.io it serves, found once (`served_resource_version`) and again after a failure.

`ResourceApi` is the seam: the publisher and the claim preparer take one; `KubeResourceApi` is the
real one (nvdp.kube's requests), `nvdp.sim.dra.api` an in-memory one for `nvdp simulate --api dra`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.base.logs import log_event
from nvdp.kube.client import get_json, strings
from nvdp.kube.nodes import node_uid
from nvdp.kube.resourceclaims import KubeResourceClaims
from nvdp.kube.resourceslices import RESOURCE_VERSIONS, KubeResourceSlices, served_resource_version

log = logging.getLogger(__name__)

Obj = dict[str, Any]


NODE_READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeCounts:
    """A Node's `status.capacity` and `status.allocatable` (resource name -> quantity, as written)."""

    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeCounts:
        status = node.get("status") or {}
        return cls(strings(status.get("capacity")), strings(status.get("allocatable")))


class SliceApi(Protocol):
    """ResourceSlices, as v1 objects (see nvdp.kube.resourceslices.KubeResourceSlices)."""

    def list(self, node: str, driver: str) -> tuple[list[Obj], str]: ...
    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj: ...
    def replace(self, obj: Obj) -> Obj: ...
    def delete(self, name: str) -> None: ...
    def watch(
        self, node: str, driver: str, since: str, *, timeout_seconds: int, silence: float
    ) -> Generator[object, None, None]:
        """Raw watch events (`{"type": ..., "object": ...}`), checked by `nvdp.kube.reflector`."""
        ...


class ClaimApi(Protocol):
    def get(self, namespace: str, name: str) -> Obj | None: ...
    def list_all(self) -> list[Any]: ...


class ResourceApi(Protocol):
    """Both, once the server's version is known; KubeError while it cannot be (unreachable, or no
    resource.k8s.io version nvdp speaks): the caller retries. `node_owner` is the ownerReference
    that makes a node's slices go with its Node, `node_counts` what the Node counts of each resource
    (both None: no such Node; KubeError: it cannot be read)."""

    def slices(self) -> SliceApi: ...
    def claims(self) -> ClaimApi: ...
    def node_owner(self, node: str) -> Obj | None: ...
    def node_counts(self, node: str) -> NodeCounts | None: ...


class KubeResourceApi:
    def __init__(self, api_client: Any) -> None:
        self._api_client = api_client
        self._lock = threading.Lock()
        self._version: str | None = None

    def version(self) -> str:
        with self._lock:
            if self._version is None:
                version = served_resource_version(self._api_client)
                if version is None:
                    raise KubeError(
                        "the API server serves no version of resource.k8s.io nvdp speaks "
                        f"({', '.join(RESOURCE_VERSIONS)}): is DRA enabled in this cluster?"
                    )
                log_event(log, logging.INFO, "resource.k8s.io found", version=version)
                self._version = version
            return self._version

    def slices(self) -> KubeResourceSlices:
        return KubeResourceSlices(self._api_client, self.version())

    def claims(self) -> KubeResourceClaims:
        return KubeResourceClaims(self._api_client, self.version())

    def node_owner(self, node: str) -> Obj | None:
        uid = node_uid(self._api_client, node)
        return (
            None
            if uid is None
            else {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}
        )

    def node_counts(self, node: str) -> NodeCounts | None:
        try:
            found = get_json(self._api_client, f"/api/v1/nodes/{node}", {}, NODE_READ_TIMEOUT_S)
        except KubeStatusError as error:
            if error.status == 404:
                return None
            raise KubeError(f"cannot read node {node}: {error}") from error
        except KubeError as error:
            raise KubeError(f"cannot read node {node}: {error}") from error
        return NodeCounts.of(found)
