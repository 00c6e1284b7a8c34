"""ResourceClaims (resource.k8s.io): one claim read by namespace and name, in the version of the API
the server serves (`nvdp.kube.resourceslices.served_resource_version`). What a kubelet plugin reads of
a claim (its UID and `status.allocation.devices.results`) has one shape in v1, v1beta2 and v1beta1."""

from __future__ import annotations

from typing import Any

from nvdp.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json
from nvdp.kube.resourceslices import RESOURCE_GROUP


class KubeResourceClaims:
    def __init__(self, api_client: Any, version: str, timeout: float = 10.0) -> None:
        self._api_client = api_client
        self.version = version
        self._timeout = timeout

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim; None when there is none. Raises KubeError (one line naming the claim)."""
        path = f"/apis/{RESOURCE_GROUP}/{self.version}/namespaces/{namespace}/resourceclaims/{name}"
        try:
            return get_json(self._api_client, path, {}, self._timeout)
        except KubeStatusError as error:
            if error.status == 404:
                return None
            raise KubeError(f"cannot read ResourceClaim {namespace}/{name}: {error}") from error
        except KubeError as error:
            raise KubeError(f"cannot read ResourceClaim {namespace}/{name}: {error}") from error
