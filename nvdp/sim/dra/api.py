"""resource.k8s.io in memory, for `nvdp simulate --api dra`: ResourceSlices (listed, created, dry-run,
replaced with resourceVersion checks, deleted, watched by node and driver), ResourceClaims and
DeviceClasses, behind the DRA driver's seam (`nvdp.plugins.dra.cluster.ResourceApi`). One resourceVersion
counter for everything, as etcd has; errors are the API's statuses (404, 409) as KubeStatusError.
The tests run the driver against the real client and the HTTP API stand-in instead."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Generator
from typing import Any

from nvdp.base.errors import KubeStatusError
from nvdp.plugins.dra.cluster import NodeCounts

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


class MemoryResourceApi:
    """Also the simulation's handle on the objects: `put`, `get`, `objects(kind)`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._objects: dict[Key, Obj] = {}
        self._events: list[tuple[int, str, Obj]] = []  # (version, type, ResourceSlice)
        self._version = 0

    # ---- nvdp.plugins.dra.cluster.ResourceApi ----
    def slices(self) -> MemoryResourceApi:
        return self

    def claims(self) -> _Claims:
        return _Claims(self)

    def node_owner(self, node: str) -> Obj | None:
        found = self.get("Node", node)
        if found is None:
            return None
        uid = found["metadata"]["uid"]
        return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}

    def node_counts(self, node: str) -> NodeCounts | None:
        found = self.get("Node", node)
        return None if found is None else NodeCounts.of(found)

    # ---- objects ----
    def put(self, kind: str, obj: Obj) -> Obj:
        """Create or replace (no version check)."""
        with self._cond:
            return self._store(
                kind, copy.deepcopy(obj), "MODIFIED" if self._key(kind, obj) in self._objects else "ADDED"
            )

    def get(self, kind: str, name: str, namespace: str = "") -> Obj | None:
        with self._cond:
            found = self._objects.get((kind, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def objects(self, kind: str) -> list[Obj]:
        with self._cond:
            return [copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items()) if k == kind]

    # ---- nvdp.plugins.dra.cluster.SliceApi ----
    def list(self, node: str, driver: str) -> tuple[list[Obj], str]:
        with self._cond:
            return [s for s in self.objects("ResourceSlice") if _selected(s, node, driver)], str(
                self._version
            )

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        with self._cond:
            if self._key("ResourceSlice", obj) in self._objects:
                raise KubeStatusError(409, f"{obj['metadata']['name']} already exists", "AlreadyExists")
            return (
                copy.deepcopy(obj) if dry_run else self._store("ResourceSlice", copy.deepcopy(obj), "ADDED")
            )

    def replace(self, obj: Obj) -> Obj:
        with self._cond:
            current = self._objects.get(self._key("ResourceSlice", obj))
            if current is None:
                raise KubeStatusError(404, f"{obj['metadata']['name']} not found", "NotFound")
            if obj["metadata"].get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
                raise KubeStatusError(409, "the object has been modified", "Conflict")
            return self._store("ResourceSlice", copy.deepcopy(obj), "MODIFIED")

    def delete(self, name: str) -> None:
        with self._cond:
            gone = self._objects.pop(("ResourceSlice", "", name), None)
            if gone is not None:
                self._version += 1
                self._events.append((self._version, "DELETED", copy.deepcopy(gone)))
                self._cond.notify_all()

    def watch(
        self, node: str, driver: str, since: str, *, timeout_seconds: int, silence: float
    ) -> Generator[object, None, None]:
        deadline = time.monotonic() + timeout_seconds
        seen = int(since or 0)
        while True:
            with self._cond:
                pending = [e for e in self._events if e[0] > seen]
                if not pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(left)
                    continue
            for version, kind, obj in pending:
                seen = version
                if _selected(obj, node, driver):
                    yield {"type": kind, "object": copy.deepcopy(obj)}

    # ---- internals ----
    @staticmethod
    def _key(kind: str, obj: Obj) -> Key:
        metadata = obj.get("metadata") or {}
        return (kind, str(metadata.get("namespace") or ""), str(metadata["name"]))

    def _store(self, kind: str, obj: Obj, event: str) -> Obj:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self._objects[self._key(kind, obj)] = obj
        if kind == "ResourceSlice":
            self._events.append((self._version, event, copy.deepcopy(obj)))
        self._cond.notify_all()
        return copy.deepcopy(obj)


class _Claims:
    def __init__(self, api: MemoryResourceApi) -> None:
        self._api = api

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._api.get("ResourceClaim", name, namespace)

    def list_all(self) -> list[Any]:
        return list(self._api.objects("ResourceClaim"))


def _selected(obj: Obj, node: str, driver: str) -> bool:
    spec = obj.get("spec") or {}
    return spec.get("nodeName") == node and spec.get("driver") == driver
