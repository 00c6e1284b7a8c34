"""The HTTP endpoint: /metrics, /healthz and /readyz on `--metrics-address`, a few lines on
`socketserver`.

One request per connection, GET and HEAD only. It imports neither http.server nor http.client, ssl or
email, which would cost the plugin process megabytes of RSS. What it serves comes from `Pages`.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import sys
import threading
import time
from typing import Protocol

from nvdp.errors import NvdpError
from nvdp.logs import log_event
from nvdp.promtext import CONTENT_TYPE

log = logging.getLogger(__name__)

_TEXT = "text/plain; charset=utf-8"
_MAX_LINE = 8192  # request line or header line
_MAX_HEADERS = 100
_LINGER_S = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class Pages(Protocol):
    """What the endpoint serves."""

    def render_metrics(self) -> bytes:
        """The exposition, text format 0.0.4."""
        ...

    def liveness_problem(self) -> str | None:
        """None when live (/healthz 200), else why not (503)."""
        ...

    def readiness_problem(self) -> str | None:
        """None when ready (/readyz 200), else why not (503)."""
        ...


def parse_address(address: str) -> tuple[str, int]:
    """Split a listen address: "host:port", ":port" (every IPv4 interface) or "[v6]:port"."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class HttpEndpoint:
    """Serves `pages` on `address` from a daemon thread; `start()` binds, `stop()` is idempotent."""

    def __init__(self, address: str, pages: Pages) -> None:
        self.address = address
        self._pages = pages
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 before start."""
        return self._http.server_address[1] if self._http is not None else 0

    def start(self) -> None:
        """Bind the address and serve on a daemon thread. Raises NvdpError when it cannot bind."""
        if self._http is not None:
            return
        host, port = parse_address(self.address)
        try:
            http = _HttpServer(host, port, self._pages)
        except OSError as error:
            raise NvdpError(f"cannot listen on metrics address {self.address!r}: {error}") from error
        self._closing.clear()
        self._http = http
        self._thread = threading.Thread(target=self._serve, args=(http,), name="nvdp-metrics", daemon=True)
        self._thread.start()
        log_event(
            log,
            logging.INFO,
            "serving metrics",
            address=f"{host or '*'}:{self.port}",
            paths="/metrics,/healthz,/readyz",
        )

    def _serve(self, http: _HttpServer) -> None:
        # handle_request blocks without a timeout (no idle wake-ups); stop() wakes it by shutting the
        # listening socket down.
        while not self._closing.is_set():
            http.handle_request()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        http, self._http = self._http, None
        thread, self._thread = self._thread, None
        if http is None:
            return
        self._closing.set()
        try:
            http.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if thread is not None:
            thread.join(2.0)
        http.server_close()


class _Handler(socketserver.StreamRequestHandler):
    server: _HttpServer
    timeout = 10.0  # a stuck client cannot hold a thread for long

    def handle(self) -> None:
        request_line = self.rfile.readline(_MAX_LINE + 1)
        if not request_line:
            return  # connected and closed (a TCP probe)
        parts = request_line.decode("latin-1").split()
        if len(request_line) > _MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._refuse(400, b"bad request\n")
        method, target, _ = parts
        for _ in range(_MAX_HEADERS):  # the headers change nothing here: read past them
            if self.rfile.readline(_MAX_LINE + 1) in (b"\r\n", b"\n", b""):
                break
        else:
            return self._refuse(431, b"too many headers\n")
        if method not in ("GET", "HEAD"):
            return self._refuse(405, b"method not allowed: use GET or HEAD\n", "Allow: GET, HEAD\r\n")
        head = method == "HEAD"
        path = target.partition("?")[0]
        pages = self.server.pages
        if path == "/metrics":
            self._reply(200, pages.render_metrics(), CONTENT_TYPE, head=head)
        elif path in ("/healthz", "/readyz"):
            problem = pages.liveness_problem() if path == "/healthz" else pages.readiness_problem()
            self._reply(200 if problem is None else 503, f"{problem or 'ok'}\n".encode(), head=head)
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", head=head)

    def _reply(
        self, code: int, body: bytes, content_type: str = _TEXT, *, head: bool = False, extra: str = ""
    ) -> None:
        header = (
            f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
        )
        self.wfile.write(header.encode() if head else header.encode() + body)

    def _refuse(self, code: int, body: bytes, extra: str = "") -> None:
        """Reply to a request not read to its end (a body, an overlong line), then read on until the
        client closes (at most _LINGER_S): closing with its bytes unread would reset the connection,
        and the client could lose the reply."""
        self._reply(code, body, extra=extra)
        self.connection.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _LINGER_S
        self.connection.settimeout(_LINGER_S)
        while time.monotonic() < deadline and self.connection.recv(65536):
            pass


class _HttpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted daemon binds despite connections in TIME_WAIT

    def __init__(self, host: str, port: int, pages: Pages) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.pages = pages
        super().__init__((host, port), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone mid-reply is not worth a traceback on stderr: one debug line."""
        log_event(
            log,
            logging.DEBUG,
            "metrics request failed",
            client=str(client_address),
            error=repr(sys.exc_info()[1]),
        )
