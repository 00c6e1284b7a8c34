"""A stand-in for the Kubernetes API server on 127.0.0.1, for tests that run a real `kubernetes`
client (in a child process or in process) against it.

Generic: objects are kept by their URL path (`/api/v1/nodes/node-a`,
`/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/ns/nodefeatures/x`); a collection path (the object path
less its last segment) lists them, `fieldSelector=metadata.name=X,spec.nodeName=Y` filters (any
dotted field, compared as text), and `watch=true` streams ADDED / MODIFIED / DELETED events as
chunked JSON lines from `resourceVersion` on, ending after `timeoutSeconds`. One resourceVersion
counter for everything, as etcd has. A discovery document is an object put at its path
(`/apis/resource.k8s.io`).

Tests drive it from the Python side: `put(path, obj)`, `patch_labels(path, labels)`, `delete(path)`,
`collect_garbage()` (Kubernetes' garbage collector: objects none of whose owners exist are deleted);
`fail(status, count, method=None, path_prefix=None)` answers the next requests with an error Status
(500, 410, ...); `expire()` forgets the event history, so a watch resuming from an older version
gets an ERROR event with code 410 (the server's "too old resource version"); `end_watches()` closes
open watch streams (a dropped connection). POST creates an object in the collection (Events) and
records it in `created` (`events(kind, name)`: the Events recorded about one Node or Pod; 409 when
its name is taken; `dryRun=All`: answered, not stored); PUT replaces an object (409 when the body's
metadata.resourceVersion is not the stored one); PATCH merges a JSON merge patch into one (a watched
MODIFIED), refused with 409 Conflict when it names a `metadata.resourceVersion` the object is no
longer at, or a strategic merge patch (`status.conditions` merged by `type`, as the API server does
for Nodes); a PATCH of `<object>/status` changes only the object's `status`; DELETE removes one.
`requests` logs (method, path, query) of every request. `drop_device_taints = True` drops the
`taints` of ResourceSlice devices on writes, as a server without the DRADeviceTaints feature does.
`foreground_deletes = True` answers a DELETE whose body asks `propagationPolicy: Foreground` by
marking the object (`metadata.deletionTimestamp`) and keeping it, as the server does while the
garbage collector deletes its dependents; the test `delete`s it when they are gone.

Faults of the connection, as real servers and networks produce them: `late_bodies = seconds` sends
every answer's headers first and its body (a stream: its final chunk) that much later, on a
keep-alive connection (a client that hands the connection back without reading the body then reads
it as the next answer's status line); `gone_every_watch = True` answers every watch with an
in-stream ERROR 410 event; `stall_watches = True` answers new watches with their headers and then
nothing (a half-open connection), until `end_watches()`; `end_every_watch = True` answers every
watch with its headers and the stream's end at once (a proxy that cuts streams); `ignore_name_selector
= True` lists and watches every object of a collection whatever `metadata.name` the field selector
names (a proxy that drops it); `inject(collection, event)` sends `event` as is (any JSON value; bytes:
the line itself, no JSON) to the watches of `collection`, in order with the stored changes.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
    foreground_deletes: bool = False
    held_gets: dict[str, threading.Event] = field(
        default_factory=dict
    )  # path -> a GET of it waits for it (30 s)

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

        class Handler(_Handler):
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
                return 404, _status(404, f"{path} not found")
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                return 409, _status(409, f"the object has been modified (resourceVersion {wanted})")
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
        name = None if self.ignore_name_selector else _field_name(query)
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
            if listed(p) and (name is None or p.endswith("/" + name)) and _fields_match(obj, query)
        ]

    def _watch(self, path: str, query: Mapping[str, str]) -> Iterator[object]:
        """Events for the collection at `path` after `resourceVersion`, until the timeout."""
        if self.gone_every_watch:
            yield {"type": "ERROR", "object": _status(410, "too old resource version (injected)")}
            return
        if self.end_every_watch:
            return
        if self.stall_watches:
            with self._lock:
                generation = self._generation
                while generation == self._generation:
                    self._lock.wait()
            return
        name = None if self.ignore_name_selector else _field_name(query)
        prefix = path.rstrip("/") + "/"
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        with self._lock:
            since = int(query.get("resourceVersion") or self._version)
            generation = self._generation
        while True:
            with self._lock:
                if since < self._oldest:
                    yield {"type": "ERROR", "object": _status(410, f"too old resource version: {since}")}
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
                if not _fields_match(event.obj, query):
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
        """What a server stores of a written object: without device taints when it drops them."""
        if self.drop_device_taints and "/resourceslices/" in path:
            for device in (obj.get("spec") or {}).get("devices") or []:
                device.pop("taints", None)
                (device.get("basic") or {}).pop("taints", None)
        return obj


def _fields_match(obj: Obj, query: Mapping[str, str]) -> bool:
    """Whether `obj` has every `field=value` of the field selector but metadata.name (by path)."""
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name":
            continue
        found: Any = obj
        for part in key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if str(found) != value.lstrip("="):
            return False
    return True


def _field_name(query: Mapping[str, str]) -> str | None:
    selector = query.get("fieldSelector", "")
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if key == "metadata.name":
            return value.lstrip("=")
    return None


def merge_patch(target: Any, patch: Any) -> Any:
    """`target` with a JSON merge patch (RFC 7386) applied; neither is changed."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


MERGE_KEYS = {"conditions": "type"}  # lists a strategic merge patch merges by key (Node status)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """`target` with a strategic merge patch applied: a merge patch, but for the lists of MERGE_KEYS,
    whose items are merged by their key (an item of a new key is appended; `"$patch": "delete"`
    removes the item of its key)."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(merged.get(key), list):
            items: list[Any] = merged[key]
            by_key = {item.get(MERGE_KEYS[key]): n for n, item in enumerate(items) if isinstance(item, dict)}
            for item in value:
                n = by_key.get(item.get(MERGE_KEYS[key])) if isinstance(item, dict) else None
                if isinstance(item, dict) and item.get("$patch") == "delete":
                    if n is not None:  # the directive removes the item of that key
                        items[n] = None
                    continue
                if n is None:
                    items.append(copy.deepcopy(item))
                else:
                    items[n] = strategic_merge_patch(items[n], item)
            merged[key] = [item for item in items if item is not None]
        else:
            merged[key] = strategic_merge_patch(merged.get(key), value)
    return merged


def _status(code: int, message: str) -> Obj:
    reasons = {404: "NotFound", 410: "Expired", 500: "InternalError", 409: "AlreadyExists"}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reasons.get(code, "Unknown"),
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    api: KubeApiStandin
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the body waits for the client's
    # delayed ACK of the headers (40 ms), which no API server makes its clients wait.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _parse(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self.api._lock:
            self.api.requests.append((self.command, parts.path, query))
        return parts.path, query

    def _send_json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._late()
        self.wfile.write(data)

    def _late(self) -> None:
        """With `late_bodies`: the headers go out now, what follows that much later."""
        if self.api.late_bodies:
            self.wfile.flush()
            time.sleep(self.api.late_bodies)

    def _failed(self, path: str, watch: bool) -> bool:
        status = self.api._take_failure(self.command, path, watch)
        if status is None:
            return False
        self._send_json(status, _status(status, f"injected failure {status}"))
        return True

    def do_GET(self) -> None:
        path, query = self._parse()
        held = self.api.held_gets.get(path)
        if held is not None:
            held.wait(30)
        watch = query.get("watch") in ("true", "1")
        if self._failed(path, watch):
            return
        if watch:
            self._stream(path, query)
            return
        with self.api._lock:
            obj = copy.deepcopy(self.api.objects.get(path))
            items = self.api._collection(path, query) if obj is None else []
            version = str(self.api._version)
        if obj is not None:
            self._send_json(200, obj)
        elif _looks_like_object(path):
            self._send_json(404, _status(404, f"{path} not found"))
        else:
            meta = {"resourceVersion": version}
            self._send_json(200, {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items})

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        return body if isinstance(body, dict) else {}

    def do_POST(self) -> None:
        path, query = self._parse()
        body = self._body()  # read first: an answer must not leave the request's body on the connection
        if self._failed(path, False):
            return
        created = self.api._create(path, body, dry_run=query.get("dryRun") == "All")
        if created is None:
            self._send_json(409, _status(409, f"{path}: {body['metadata']['name']} already exists"))
            return
        self._send_json(201, created)

    def do_PUT(self) -> None:
        path, _ = self._parse()
        body = self._body()
        if self._failed(path, False):
            return
        if path not in self.api.objects:
            self._send_json(404, _status(404, f"{path} not found"))
            return
        replaced = self.api._replace(path, body)
        if replaced is None:
            self._send_json(409, _status(409, f"{path}: the object has been modified"))
            return
        self._send_json(200, replaced)

    def do_DELETE(self) -> None:
        path, _ = self._parse()
        body = self._body()
        if self._failed(path, False):
            return
        foreground = body.get("propagationPolicy") == "Foreground" and self.api.foreground_deletes
        with self.api._lock:
            found = path in self.api.objects
            if found and foreground:  # kept, marked, until the test deletes it (the pods went)
                obj = copy.deepcopy(self.api.objects[path])
                obj["metadata"].setdefault("deletionTimestamp", "2026-12-05T00:00:00Z")
                self.api._store("MODIFIED", path, obj)
            elif found:
                self.api.delete(path)
        if not found:
            self._send_json(404, _status(404, f"{path} not found"))
            return
        self._send_json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_PATCH(self) -> None:
        path, _ = self._parse()
        body = self._body()
        if self._failed(path, False):
            return
        kind = self.headers.get("Content-Type")
        if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            self._send_json(415, _status(415, f"unsupported patch type {kind}"))
            return
        self._send_json(*self.api._patch(path, body, strategic=kind.startswith("application/strategic")))

    def _stream(self, path: str, query: Mapping[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in self.api._watch(path, query):
                line = (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self._late()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _looks_like_object(path: str) -> bool:
    """After /api/v1 or /apis/<group>/<version>: an even number of segments names an object
    (`nodes/x`, `namespaces/ns/events/x`), an odd number a collection (`nodes`, `namespaces/ns/events`)."""
    segments = [s for s in path.split("/") if s]
    base = 2 if segments[:1] == ["api"] else 3
    return (len(segments) - base) % 2 == 0 and len(segments) > base
