"""One ConfigMap as the API serves it: its entries (`data`, and `binaryData` decoded, as the kubelet
writes both into a mounted volume) and its resourceVersion, read by name (`read_configmap`: one GET).
A list+watch by name is the caller's (`get_json` / `watch` on `configmaps_path`, field selector
`metadata.name`: what RBAC `resourceNames` authorizes for list and watch)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import get_json


def configmaps_path(namespace: str) -> str:
    """The collection of ConfigMaps in `namespace`."""
    return f"/api/v1/namespaces/{namespace}/configmaps"


@dataclass(frozen=True)
class ConfigMapData:
    """A ConfigMap's entries (name -> content) at one resourceVersion."""

    version: str
    entries: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ConfigMapData:
        """From the object's JSON. Raises ValueError for a `binaryData` value that is no base64 (the
        API server never sends one)."""
        metadata = obj.get("metadata") or {}
        entries = {str(k): str(v).encode("utf-8") for k, v in (obj.get("data") or {}).items()}
        for key, value in (obj.get("binaryData") or {}).items():
            try:
                entries[str(key)] = base64.b64decode(str(value), validate=True)
            except binascii.Error as error:
                raise ValueError(f"binaryData {key!r} is not base64: {error}") from error
        return cls(str(metadata.get("resourceVersion") or ""), entries)


def read_configmap(
    api_client: Any, namespace: str, name: str, *, timeout: float = 10.0
) -> ConfigMapData | None:
    """The ConfigMap `namespace/name` (one GET); None when there is none. Raises KubeError."""
    try:
        return ConfigMapData.of(get_json(api_client, f"{configmaps_path(namespace)}/{name}", {}, timeout))
    except KubeStatusError as error:
        if error.status == 404:
            return None
        failure: Exception = error
    except (KubeError, ValueError) as error:  # no answer, or one that is no ConfigMap
        failure = error
    raise KubeError(f"cannot read configmap {namespace}/{name}: {failure}") from failure
