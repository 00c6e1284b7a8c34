"""The API stand-in's state: objects by path, one resourceVersion counter, the event history its
watches read, injected failures; and its HTTP server (`testkit.kube_api_standin.handler`)."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from testkit.kube_api_standin.handler import RequestHandler
from testkit.kube_api_standin.patches import (
    field_name,
    fields_match,
    merge_patch,
    status_object,
    strategic_merge_patch,
)

Obj = dict[str, Any]


@dataclass
class _Failure:
    status: int
    count: int
    method: str | None
    path_prefix: str | None
    watch: bool | None


@dataclass
class _Event:
    version: int
    kind: str
    path: str
    obj: Obj
    at: float = field(default_factory=time.monotonic)  # when it was stored
    raw: object = None  # an injected event, sent as is


@dataclass
class KubeApiStandin:
    """Start with `with KubeApiStandin() as api:`; `api.url` is `http://127.0.0.1:<port>`."""

    objects: dict[str, Obj] = field(default_factory=dict)
    created: list[Obj] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    late_bodies: float = 0.0
    gone_every_watch: bool = False
    stall_watches: bool = False
    end_every_watch: bool = False
    ignore_name_selector: bool = False
    drop_device_taints: bool = False
    drop_consumable_capacity: bool = False
    foreground_deletes: bool = False
    held_gets: dict[str, threading.Event] = field(default_factory=dict)  # path -> a GET waits for it (30 s)

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._version = 100
        self._events: list[_Event] = []
        self._oldest = 0  # watches from before this version get 410 Gone
        self._failures: list[_Failure] = []
        self._generation = 0  # bumped by end_watches()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> KubeApiStandin:
        standin = self

        class Handler(RequestHandler):
            api = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # polls for shutdown() every 0.02 s (the default 0.5 s made each stop take up to half a second)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="kube-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.end_watches()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeApiStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file (JSON is YAML) pointing at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": "standin-token"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config))
        return path

    # ---- objects ---------------------------------------------------------------------------------

    def put(self, path: str, obj: Obj) -> Obj:
        """Create or replace the object at `path` (a new resourceVersion; watchers see it)."""
        with self._lock:
            kind = "MODIFIED" if path in self.objects else "ADDED"
            return self._store(kind, path, copy.deepcopy(obj))

    def patch_labels(self, path: str, labels: Mapping[str, str | None]) -> Obj:
        """Set labels (None removes one) on the object at `path`."""
        with self._lock:
            obj = copy.deepcopy(self.objects[path])
            current = obj.setdefault("metadata", {}).setdefault("labels", {})
            for key, value in labels.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            return self._store("MODIFIED", path, obj)

    def merge_patch(self, path: str, patch: Obj) -> Obj | None:
        """Apply a JSON merge patch (RFC 7386) to the object at `path`; None when there is none."""
        with self._lock:
            if path not in self.objects:
                return None
            return self._store("MODIFIED", path, merge_patch(self.objects[path], patch))

    def _patch(self, path: str, patch: Obj, strategic: bool) -> tuple[int, Obj]:
        """A PATCH request's answer: `path` may end in /status (only `status` is patched)."""
        target = path.removesuffix("/status")
        if target != path:
            patch = {"status": patch.get("status")} if "status" in patch else {}
        with self._lock:
            current = self.objects.get(target)
            if current is None:
                return 404, status_object(404, f"{path} not found")
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                return 409, status_object(409, f"the object has been modified (resourceVersion {wanted})")
            merged = strategic_merge_patch(current, patch) if strategic else merge_patch(current, patch)
            return 200, self._store("MODIFIED", target, merged)

    def delete(self, path: str) -> None:
        with self._lock:
            obj = self.objects.pop(path)
            self._version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._events.append(_Event(self._version, "DELETED", path, obj))
            self._lock.notify_all()

    def collect_garbage(self) -> list[str]:
        """One pass of Kubernetes' garbage collector: delete each object that has ownerReferences and
        none of whose owners (by uid) exists any more. The paths deleted."""
        with self._lock:
            uids = {(obj.get("metadata") or {}).get("uid") for obj in self.objects.values()} - {None}
            orphans = [
                path
                for path, obj in self.objects.items()
                if (owners := (obj.get("metadata") or {}).get("ownerReferences"))
                and not any(owner.get("uid") in uids for owner in owners)
            ]
        for path in orphans:
            self.delete(path)
        return orphans

    def _store(self, kind: str, path: str, obj: Obj) -> Obj:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.objects[path] = obj
        self._events.append(_Event(self._version, kind, path, copy.deepcopy(obj)))
        self._lock.notify_all()
        return obj

    # ---- faults ----------------------------------------------------------------------------------

    def fail(
        self,
        status: int,
        count: int = 1,
        *,
        method: str | None = None,
        path_prefix: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """Answer the next `count` matching requests with HTTP `status` and a Status body."""
        with self._lock:
            self._failures.append(_Failure(status, count, method, path_prefix, watch))

    def clear_failures(self) -> None:
        """Answer normally again."""
        with self._lock:
            self._failures.clear()

    def expire(self) -> None:
        """Forget the event history: a watch from an older resourceVersion gets 410 Gone."""
        with self._lock:
            self._version += 1  # the compaction point: a list now returns a version watchable again
            self._oldest = self._version
            self._events.clear()

    def inject(self, collection: str, event: object) -> None:
        """Send `event` as is to the watches of `collection` (after the changes stored before it)."""
        with self._lock:
            self._version += 1
            self._events.append(_Event(self._version, "RAW", collection.rstrip("/") + "/", {}, raw=event))
            self._lock.notify_all()

    def end_watches(self) -> None:
        """Close every open watch stream (the client sees the connection end)."""
        with self._lock:
            self._generation += 1
            self._lock.notify_all()

    def stop_watch(self, stop: threading.Event, thread: threading.Thread, timeout: float = 5.0) -> None:
        """Stop a watch loop running on `thread`: `stop` set, and its watches ended until the thread
        returned (a watch it began after one end_watches() would wait for the server's timeout)."""
        stop.set()
        deadline = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < deadline:
            self.end_watches()
            thread.join(0.05)

    def writes(self, prefix: str) -> list[tuple[float, str, Obj | None]]:
        """Every write under `prefix` as (time.monotonic() when stored, path, the object; None when
        deleted), in order: what a watcher of those objects saw, and when."""
        with self._lock:
            return [
                (e.at, e.path, None if e.kind == "DELETED" else e.obj)
                for e in self._events
                if e.path.startswith(prefix)
            ]

    def count(self, method: str, path: str, *, watch: bool | None = None) -> int:
        with self._lock:
            return sum(
                1
                for m, p, q in self.requests
                if m == method and p == path and (watch is None or (q.get("watch") in ("true", "1")) == watch)
            )

    def events(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[Obj]:
        """The Events created about objects of `kind` (e.g. Pod, Node), of that name and namespace when
        given, in the order they were created."""
        with self._lock:
            found = []
            for obj in self.created:
                involved = obj.get("involvedObject") or {}
                if obj.get("kind") != "Event" or involved.get("kind") != kind:
                    continue
                if name is not None and involved.get("name") != name:
                    continue
                if namespace is not None and involved.get("namespace") != namespace:
                    continue
                found.append(copy.deepcopy(obj))
            return found

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout}s")
            time.sleep(0.01)

    # ---- request handling (called from the handler threads) --------------------------------------

    def _take_failure(self, method: str, path: str, watch: bool) -> int | None:
        with self._lock:
            for failure in self._failures:
                if failure.method not in (None, method):
                    continue
                if failure.path_prefix is not None and not path.startswith(failure.path_prefix):
                    continue
                if failure.watch is not None and failure.watch != watch:
                    continue
                failure.count -= 1
                if failure.count <= 0:
                    self._failures.remove(failure)
                return failure.status
        return None

    def _collection(self, path: str, query: Mapping[str, str]) -> list[Obj]:
        name = None if self.ignore_name_selector else field_name(query)
        prefix = path.rstrip("/") + "/"
        head, _, plural = path.rstrip("/").rpartition("/")

        def listed(p: str) -> bool:
            if p.startswith(prefix):
                return "/" not in p[len(prefix) :]
            every_namespace = head + "/namespaces/"  # a namespaced kind listed across namespaces
            return p.startswith(every_namespace) and p[len(every_namespace) :].split("/")[1:2] == [plural]

        return [
            copy.deepcopy(obj)
            for p, obj in sorted(self.objects.items())
            if listed(p) and (name is None or p.endswith("/" + name)) and fields_match(obj, query)
        ]

    def _watch(self, path: str, query: Mapping[str, str]) -> Iterator[object]:
        """Events for the collection at `path` after `resourceVersion`, until the timeout."""
        if self.gone_every_watch:
            yield {"type": "ERROR", "object": status_object(410, "too old resource version (injected)")}
            return
        if self.end_every_watch:
            return
        if self.stall_watches:
            with self._lock:
                generation = self._generation
                while generation == self._generation:
                    self._lock.wait()
            return
        name = None if self.ignore_name_selector else field_name(query)
        prefix = path.rstrip("/") + "/"
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        with self._lock:
            since = int(query.get("resourceVersion") or self._version)
            generation = self._generation
        while True:
            with self._lock:
                if since < self._oldest:
                    yield {
                        "type": "ERROR",
                        "object": status_object(410, f"too old resource version: {since}"),
                    }
                    return
                pending = [e for e in self._events if e.version > since]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or generation != self._generation:
                        return
                    self._lock.wait(min(remaining, 0.5))
                    if generation != self._generation:
                        return
                    continue
            for event in pending:
                since = event.version
                if event.raw is not None:
                    if event.path == prefix:
                        yield event.raw
                    continue
                rest = event.path[len(prefix) :] if event.path.startswith(prefix) else None
                if rest is None or "/" in rest or (name is not None and rest != name):
                    continue
                if not fields_match(event.obj, query):
                    continue
                yield {"type": event.kind, "object": event.obj}

    def _create(self, path: str, body: Obj, dry_run: bool = False) -> Obj | None:
        """The stored object; None when the name is taken."""
        with self._lock:
            name = body.get("metadata", {}).get("name") or f"obj-{self._version + 1}"
            target = f"{path.rstrip('/')}/{name}"
            if target in self.objects:
                return None
            body = self._admitted(target, copy.deepcopy(body))
            if dry_run:
                return body
            stored = self._store("ADDED", target, body)
            self.created.append(copy.deepcopy(stored))
            return stored

    def _replace(self, path: str, body: Obj) -> Obj | None:
        """PUT: the stored object; None when the body's resourceVersion is not the stored one."""
        with self._lock:
            given = (body.get("metadata") or {}).get("resourceVersion")
            if given and given != self.objects[path]["metadata"].get("resourceVersion"):
                return None
            return self.put(path, self._admitted(path, body))

    def _admitted(self, path: str, obj: Obj) -> Obj:
        """What a server stores of a written object: without device taints, or consumable capacity's
        fields (`allowMultipleAllocations`, `requestPolicy`), when it drops them."""
        if "/resourceslices/" in path:
            for device in (obj.get("spec") or {}).get("devices") or []:
                for fields in (device, device.get("basic") or {}):
                    if self.drop_device_taints:
                        fields.pop("taints", None)
                    if self.drop_consumable_capacity:
                        fields.pop("allowMultipleAllocations", None)
                        for capacity in (fields.get("capacity") or {}).values():
                            capacity.pop("requestPolicy", None)
        return obj
