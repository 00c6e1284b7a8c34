"""ResourceSlices (resource.k8s.io): the API version the server serves, and one node's and driver's
slices listed, created (or dry-run), replaced, deleted and watched.

- Callers speak resource.k8s.io/v1; `served_resource_version` says which version the server serves
  (Kubernetes 1.32: v1beta1 only, 1.33: v1beta2), and `KubeResourceSlices` converts to it.
- v1beta2 has v1's shape; v1beta1 wraps each device's attributes, capacity and taints in `basic`.
- An error status is a KubeStatusError (409: the slice exists, or changed since it was read; the
  caller names the slice); any other failure is a one-line KubeError naming the slice.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.errors import KubeError, KubeStatusError
from nvdp.kube.client import MAX_ANSWER_BYTES, get_json, one_line, request, watch

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first: the first the server serves is used
_BASIC = (
    "attributes",
    "capacity",
    "taints",
    "allowMultipleAllocations",
)  # a device's fields v1beta1 keeps under `basic`

Obj = dict[str, Any]


def served_resource_version(api_client: Any, timeout: float = 10.0) -> str | None:
    """The newest version of resource.k8s.io the server serves that nvdp speaks; None when it serves
    none (DRA is off in this cluster). Raises KubeError when the server cannot say."""
    path = f"/apis/{RESOURCE_GROUP}"
    try:
        group = get_json(api_client, path, {}, timeout)
    except KubeStatusError as error:
        if error.status == 404:
            return None
        raise KubeError(f"cannot read {path}: {error}") from error
    except KubeError as error:
        raise KubeError(f"cannot read {path}: {error}") from error
    served = {str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, Mapping)}
    return next((v for v in RESOURCE_VERSIONS if v in served), None)


def to_served(obj: Obj, version: str) -> Obj:
    """A v1 ResourceSlice as `version` spells it."""
    out = {**obj, "apiVersion": f"{RESOURCE_GROUP}/{version}"}
    if version == "v1beta1":
        spec = dict(obj.get("spec") or {})
        spec["devices"] = [
            {
                **{k: v for k, v in d.items() if k not in _BASIC},
                "basic": {k: d[k] for k in _BASIC if k in d},
            }
            for d in spec.get("devices") or []
        ]
        out["spec"] = spec
    return out


def from_served(obj: Obj) -> Obj:
    """A ResourceSlice as the server sent it, in v1's shape."""
    spec = dict(obj["spec"]) if isinstance(obj.get("spec"), Mapping) else {}
    listed = spec.get("devices")
    devices: list[Any] = listed if isinstance(listed, list) else []
    if any(isinstance(d, Mapping) and isinstance(d.get("basic"), Mapping) for d in devices):
        spec["devices"] = [
            {**{k: v for k, v in d.items() if k != "basic"}, **d["basic"]}
            if isinstance(d, Mapping) and isinstance(d.get("basic"), Mapping)
            else d
            for d in devices
        ]
    return {**obj, "apiVersion": f"{RESOURCE_GROUP}/v1", "spec": spec}


class KubeResourceSlices:
    """The slices of one version of the API (`served_resource_version`). Objects in and out are v1's."""

    def __init__(self, api_client: Any, version: str, timeout: float = 10.0) -> None:
        self._api_client = api_client
        self.version = version
        self._timeout = timeout
        self.collection = f"/apis/{RESOURCE_GROUP}/{version}/resourceslices"

    @staticmethod
    def selector(node: str, driver: str) -> str:
        return f"spec.nodeName={node},spec.driver={driver}"

    def list(self, node: str, driver: str) -> tuple[list[Obj], str]:
        """The slices of `node` and `driver`, and the list's resourceVersion (to watch from)."""
        query = {"fieldSelector": self.selector(node, driver)}
        try:
            found = get_json(self._api_client, self.collection, query, self._timeout)
        except KubeStatusError:
            raise
        except KubeError as error:
            raise KubeError(f"cannot list the ResourceSlices of node {node}: {error}") from error
        items = [from_served(dict(i)) for i in found.get("items") or [] if isinstance(i, Mapping)]
        return items, str((found.get("metadata") or {}).get("resourceVersion") or "")

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """Create the slice; with `dry_run`, what the server would store (nothing is stored)."""
        query = {"dryRun": "All"} if dry_run else {}
        return self._send("POST", self.collection, query, obj, "create")

    def replace(self, obj: Obj) -> Obj:
        """Replace the slice (its metadata.resourceVersion: 409 when it changed since)."""
        return self._send("PUT", f"{self.collection}/{obj['metadata']['name']}", {}, obj, "replace")

    def delete(self, name: str) -> None:
        """Delete the slice; one already gone is no error."""
        try:
            request(self._api_client, "DELETE", f"{self.collection}/{name}", {}, self._timeout)
        except KubeStatusError as error:
            if error.status != 404:
                raise
        except Exception as error:  # urllib3 / socket errors: one line, not a traceback
            raise KubeError(f"cannot delete ResourceSlice {name}: {one_line(error)}") from error

    def watch(
        self, node: str, driver: str, since: str, *, timeout_seconds: int, silence: float
    ) -> Generator[object, None, None]:
        """The raw events (unchecked: `nvdp.kube.reflector` checks them) of the slices of `node` and
        `driver` from resourceVersion `since`, each object in v1's shape, until the server ends the
        watch after `timeout_seconds`; `close()` to leave early. Raises KubeGone (410: list again),
        KubeWatchSilent, KubeError."""
        query = {
            "fieldSelector": self.selector(node, driver),
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            "watch": "true",
        }
        events = watch(self._api_client, self.collection, query, silence=silence)
        try:
            for event in events:
                obj = event.get("object") if isinstance(event, Mapping) else None
                if isinstance(event, Mapping) and isinstance(obj, Mapping):
                    yield {**event, "object": from_served(dict(obj))}
                else:
                    yield event
        finally:
            events.close()

    def _send(self, method: str, path: str, query: Mapping[str, str], obj: Obj, verb: str) -> Obj:
        name = obj["metadata"]["name"]
        served = to_served(obj, self.version)
        try:
            answer = loads_json(
                request(self._api_client, method, path, query, self._timeout, body=served),
                max_bytes=MAX_ANSWER_BYTES,
            )
        except KubeStatusError:
            raise
        except Exception as error:  # urllib3 / socket errors, a body that is no JSON
            raise KubeError(f"cannot {verb} ResourceSlice {name}: {one_line(error)}") from error
        if not isinstance(answer, dict):
            raise KubeError(f"cannot {verb} ResourceSlice {name}: unexpected answer")
        return from_served(answer)
