"""The API stand-in's HTTP side: GET (objects, lists, watches), POST, PUT, PATCH, DELETE."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from testkit.kube_api_standin.patches import status_object

if TYPE_CHECKING:
    from testkit.kube_api_standin.server import KubeApiStandin

Obj = dict[str, Any]


class RequestHandler(BaseHTTPRequestHandler):
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
        self._send_json(status, status_object(status, f"injected failure {status}"))
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
            self._send_json(404, status_object(404, f"{path} not found"))
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
            self._send_json(409, status_object(409, f"{path}: {body['metadata']['name']} already exists"))
            return
        self._send_json(201, created)

    def do_PUT(self) -> None:
        path, _ = self._parse()
        body = self._body()
        if self._failed(path, False):
            return
        if path not in self.api.objects:
            self._send_json(404, status_object(404, f"{path} not found"))
            return
        replaced = self.api._replace(path, body)
        if replaced is None:
            self._send_json(409, status_object(409, f"{path}: the object has been modified"))
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
            self._send_json(404, status_object(404, f"{path} not found"))
            return
        self._send_json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_PATCH(self) -> None:
        path, _ = self._parse()
        body = self._body()
        if self._failed(path, False):
            return
        kind = self.headers.get("Content-Type")
        if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            self._send_json(415, status_object(415, f"unsupported patch type {kind}"))
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
