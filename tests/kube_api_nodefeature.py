"""A small Kubernetes API server stand-in on 127.0.0.1 for tests that use the real `kubernetes` client.

Objects are stored by their item path (`/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`):
GET reads one, POST to the collection creates (409 when it exists), PUT replaces (409 on a stale
resourceVersion), PATCH merges (JSON merge patch), DELETE removes. Every request is recorded;
`fail_next(n, status)` makes the next n requests fail with that status and a Status body.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

from tests.kube_api_standin import merge_patch


class Request(NamedTuple):
    method: str
    path: str
    body: Any
    status: int


class KubeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._failures: list[int] = []
        self._version = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw else None

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                body = self._body()
                path = self.path.split("?", 1)[0].rstrip("/")
                status, reply = api._serve(self.command, path, body)
                with api._lock:
                    api.requests.append(Request(self.command, path, body, status))
                self._reply(status, reply)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        serve = self._server.serve_forever
        self._thread = threading.Thread(
            target=serve, args=(0.02,), name="kube-api", daemon=True
        )  # stops at once

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> KubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> KubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_next(self, count: int, status: int = 500) -> None:
        with self._lock:
            self._failures.extend([status] * count)

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": "test-token"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config))
        return path

    def requests_to(self, fragment: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if fragment in r.path]

    def get(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get(path)
            return copy.deepcopy(found) if found is not None else None

    # ---- the API ------------------------------------------------------------------------------
    def _status(self, code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
        return code, {**body, "message": message}

    def _serve(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            if self._failures:
                code = self._failures.pop(0)
                return self._status(code, "InternalError", "injected failure")
            if method == "POST":
                name = (body or {}).get("metadata", {}).get("name", "")
                item = f"{path}/{name}"
                if item in self.objects:
                    return self._status(409, "AlreadyExists", f"{name} already exists")
                return 201, self._store(item, body)
            current = self.objects.get(path)
            if current is None:
                return self._status(404, "NotFound", f"{path} not found")
            if method == "GET":
                return 200, copy.deepcopy(current)
            if method == "DELETE":
                del self.objects[path]
                return 200, {"kind": "Status", "status": "Success"}
            if method == "PUT":
                version = (body or {}).get("metadata", {}).get("resourceVersion")
                if version and version != current["metadata"]["resourceVersion"]:
                    return self._status(409, "Conflict", "the object has been modified")
                return 200, self._store(path, body)
            if method == "PATCH":
                return 200, self._store(path, merge_patch(current, body))
            return self._status(405, "MethodNotAllowed", method)

    def _store(self, item: str, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = copy.deepcopy(body)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.objects[item] = stored
        return copy.deepcopy(stored)
