"""ResourceClaims (resource.k8s.io): one claim read by namespace and name, and every claim of the
cluster (paged), in the version of the API the server serves
(`nvdp.kube.resourceslices.served_resource_version`). What a kubelet plugin reads of a claim (its UID,
`status.allocation.devices.results`, `status.reservedFor`) has one shape in v1, v1beta2 and v1beta1.
Names are quoted in the path: a name is never more than one path segment."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json
from nvdp.kube.resourceslices import RESOURCE_GROUP

LIST_PAGE = 500
MAX_LIST_PAGES = 200  # 100,000 claims


class KubeResourceClaims:
    def __init__(self, api_client: Any, version: str, timeout: float = 10.0) -> None:
        self._api_client = api_client
        self.version = version
        self._timeout = timeout

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim; None when there is none. Raises KubeError (one line naming the claim)."""
        path = (
            f"/apis/{RESOURCE_GROUP}/{self.version}/namespaces/{quote(namespace, safe='')}"
            f"/resourceclaims/{quote(name, safe='')}"
        )
        try:
            return get_json(self._api_client, path, {}, self._timeout)
        except KubeStatusError as error:
            if error.status == 404:
                return None
            raise KubeError(f"cannot read ResourceClaim {namespace}/{name}: {error}") from error
        except KubeError as error:
            raise KubeError(f"cannot read ResourceClaim {namespace}/{name}: {error}") from error

    def list_all(self) -> list[Any]:
        """Every claim of the cluster (the list's items, as the server gives them). Raises KubeError."""
        path = f"/apis/{RESOURCE_GROUP}/{self.version}/resourceclaims"
        items: list[Any] = []
        query = {"limit": str(LIST_PAGE)}
        for _ in range(MAX_LIST_PAGES):
            try:
                page = get_json(self._api_client, path, query, self._timeout)
            except KubeError as error:
                raise KubeError(f"cannot list ResourceClaims: {error}") from error
            found = page.get("items")
            items += found if isinstance(found, list) else []
            metadata = page.get("metadata")
            more = metadata.get("continue") if isinstance(metadata, dict) else None
            if not more or not isinstance(more, str):
                return items
            query = {"limit": str(LIST_PAGE), "continue": more}
        raise KubeError(f"cannot list ResourceClaims: more than {LIST_PAGE * MAX_LIST_PAGES}")
