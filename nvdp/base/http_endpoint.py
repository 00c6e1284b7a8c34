"""The HTTP endpoint of nvdp's processes: /metrics, /healthz and /readyz on a listen address, a few
lines on `socketserver` (the plugin's `--metrics-address` through `nvdp.plugins.metrics`, config-manager's).

- One request per connection, GET and HEAD only.
- The request line and headers (at most 100 lines of 8 KiB, 64 KiB in all) must arrive within
  REQUEST_DEADLINE_S, else 408 and close; a reply must be taken within REPLY_DEADLINE_S.
- At most MAX_CONNECTIONS at once, a thread each; one more closes the oldest still sending its
  request, so slow clients cannot keep the kubelet's probes out.
- No http.server, http.client, ssl or email import: they cost megabytes of RSS.
- Content comes from `Pages` (a command may add its own: the plugin's /allocations), told `peer`
  (`is_loopback`: on this host, as `nvdp status` is); `ServedPages` is a command's status pages with
  their endpoint (`nvdp.plugins.metrics.Metrics`, `nvdp.side.configmanager.status.StatusServer`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, Self

from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event
from nvdp.base.promtext import CONTENT_TYPE
from nvdp.base.timers import TIMERS

log = logging.getLogger(__name__)

REQUEST_DEADLINE_S = TIMERS.request_deadline  # from the connection to the end of its headers (3 s)
REPLY_DEADLINE_S = 5.0  # for the client to take the reply
MAX_CONNECTIONS = 32  # handled at once (a thread each)

_TEXT = "text/plain; charset=utf-8"
_MAX_LINE = 8192  # request line or header line
_MAX_HEADERS = 100
_MAX_HEAD = 64 * 1024  # request line and headers together
_LINGER_S = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class Pages(Protocol):
    """What the endpoint serves; `peer` is the client's IP address, as its connection says."""

    def render_metrics(self, peer: str) -> bytes:
        """The exposition, text format 0.0.4."""
        ...

    def liveness_problem(self) -> str | None:
        """None when live (/healthz 200), else why not (503)."""
        ...

    def readiness_problem(self) -> str | None:
        """None when ready (/readyz 200), else why not (503)."""
        ...

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        """Another page at `path` (the plugin's /allocations): its content type and body; None: not
        found (404)."""
        ...


class Endpoint(Protocol):
    """Where pages are served (`HttpEndpoint`): `start()` binds and serves (NvdpError when it cannot),
    `stop()` is idempotent, `port` is the bound port (0 before start)."""

    @property
    def port(self) -> int: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


EndpointFactory = Callable[[str, Pages], Endpoint]  # (listen address, pages) -> endpoint


class ServedPages:
    """Pages (a subclass is them) and the `Endpoint` that serves them on `address`."""

    def __init__(self, address: str, pages: Pages, endpoint: EndpointFactory | None = None) -> None:
        self.address = address
        self._endpoint = (endpoint or HttpEndpoint)(address, pages)

    @property
    def port(self) -> int:
        return self._endpoint.port

    def start(self) -> Self:
        self._endpoint.start()
        return self

    def start_or_disable(self) -> bool:
        """Start serving; False when the address cannot be bound, said in one ERROR line: the daemon
        serves its devices without the endpoint (the probes then fail, which is what surfaces it)."""
        try:
            self._endpoint.start()
        except NvdpError as error:
            log_event(
                log, logging.ERROR, "metrics endpoint disabled; serving devices without it", error=str(error)
            )
            return False
        return True

    def stop(self) -> None:
        self._endpoint.stop()


def is_loopback(peer: str) -> bool:
    """Whether the client address `peer` is on this host's loopback: 127.0.0.0/8, ::1, or an
    IPv4-mapped 127.x (a dual-stack socket's IPv4 client). Any other address, the node's own
    included, is remote."""
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


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


class _Refusal(Exception):
    """A request answered with an error status (`code`) before it was read to its end."""

    def __init__(self, code: int, body: bytes) -> None:
        super().__init__(code)
        self.code = code
        self.body = body


class _Connection:
    """One client connection: its request read within the deadline, then answered."""

    def __init__(self, sock: socket.socket, peer: str, pages: Pages) -> None:
        self.sock = sock
        self.peer = peer  # the client's IP address
        self.pages = pages
        self.reading = True  # still sending its request: the one to close when connections run out

    def evict(self) -> None:
        """Close it under its thread (which then sees the connection end)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def serve(self) -> None:
        try:
            head = self._read_head(time.monotonic() + REQUEST_DEADLINE_S)
        except _Refusal as refusal:
            self.reading = False
            if refusal.code == 408:
                self.sock.settimeout(_LINGER_S)
                self._reply(408, refusal.body)  # no lingering for a client this slow
            else:
                self._refuse(refusal.code, refusal.body)
            return
        self.reading = False
        if head is None:
            return  # connected and closed (a TCP probe), or closed mid-request
        self.sock.settimeout(REPLY_DEADLINE_S)  # sendall: the whole reply within it
        self._answer(head)

    def _read_head(self, deadline: float) -> list[bytes] | None:
        """The request line and header lines; None when the client closed first."""
        buffer = bytearray()
        while True:
            end = _head_end(buffer)
            if end >= 0:
                return [line.removesuffix(b"\r") for line in bytes(buffer[:end]).split(b"\n")]
            if b"\n" not in buffer and len(buffer) > _MAX_LINE:
                raise _Refusal(400, b"bad request\n")
            if len(buffer) > _MAX_HEAD:
                raise _Refusal(431, b"request headers too large\n")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Refusal(408, b"request not received in time\n")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(16384)
            except TimeoutError:
                raise _Refusal(408, b"request not received in time\n") from None
            if not chunk:
                return None
            buffer += chunk

    def _answer(self, head: list[bytes]) -> None:
        request_line, headers = head[0], head[1:]
        parts = request_line.decode("latin-1").split()
        if len(request_line) > _MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._refuse(400, b"bad request\n")
        if len(headers) > _MAX_HEADERS or any(len(line) > _MAX_LINE for line in headers):
            return self._refuse(431, b"too many headers\n")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return self._refuse(405, b"method not allowed: use GET or HEAD\n", "Allow: GET, HEAD\r\n")
        head_only = method == "HEAD"
        path = target.partition("?")[0]
        if path == "/metrics":
            self._reply(200, self.pages.render_metrics(self.peer), CONTENT_TYPE, head=head_only)
        elif path in ("/healthz", "/readyz"):
            pages = self.pages
            problem = pages.liveness_problem() if path == "/healthz" else pages.readiness_problem()
            self._reply(200 if problem is None else 503, f"{problem or 'ok'}\n".encode(), head=head_only)
        elif (page := self.pages.extra_page(path, self.peer)) is not None:
            self._reply(200, page[1], page[0], head=head_only)
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", head=head_only)

    def _reply(
        self, code: int, body: bytes, content_type: str = _TEXT, *, head: bool = False, extra: str = ""
    ) -> None:
        header = (
            f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
        )
        self.sock.sendall(header.encode() if head else header.encode() + body)

    def _refuse(self, code: int, body: bytes, extra: str = "") -> None:
        """Reply to a request not read to its end (a body, an overlong line), then read on until the
        client closes (at most _LINGER_S): closing with its bytes unread would reset the connection,
        and the client could lose the reply."""
        self.sock.settimeout(_LINGER_S)
        self._reply(code, body, extra=extra)
        self.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + _LINGER_S
        while time.monotonic() < deadline and self.sock.recv(65536):
            pass


def _head_end(buffer: bytearray) -> int:
    """Where the request line and headers end (before the first empty line); -1 while incomplete."""
    ends = [i for i in (buffer.find(b"\n\r\n"), buffer.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1


class _HttpServer(socketserver.TCPServer):
    allow_reuse_address = True  # a restarted daemon binds despite connections in TIME_WAIT
    request_queue_size = 128  # a burst of connections waits to be accepted, not refused

    def __init__(self, host: str, port: int, pages: Pages) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.pages = pages
        self._lock = threading.Lock()
        self._open: list[_Connection] = []  # oldest first
        super().__init__((host, port), socketserver.BaseRequestHandler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        """Serve the connection on a thread of its own; over MAX_CONNECTIONS, first close the oldest
        one still sending its request (or, with none, this one)."""
        peer = client_address[0] if isinstance(client_address, tuple) and client_address else ""
        connection = _Connection(request, str(peer), self.pages)
        with self._lock:
            if len(self._open) >= MAX_CONNECTIONS:
                slowest = next((c for c in self._open if c.reading), None)
                if slowest is None:
                    self.shutdown_request(request)
                    return
                self._open.remove(slowest)
                slowest.evict()
            self._open.append(connection)
        thread = threading.Thread(
            target=self._serve_connection, args=(connection, client_address), name="nvdp-http", daemon=True
        )
        thread.start()

    def _serve_connection(self, connection: _Connection, client_address: object) -> None:
        try:
            connection.serve()
        except Exception:
            self.handle_error(connection.sock, client_address)
        finally:
            with self._lock:
                if connection in self._open:
                    self._open.remove(connection)
            self.shutdown_request(connection.sock)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone mid-reply is not worth a traceback on stderr: one debug line."""
        log_event(
            log,
            logging.DEBUG,
            "metrics request failed",
            client=str(client_address),
            error=repr(sys.exc_info()[1]),
        )
