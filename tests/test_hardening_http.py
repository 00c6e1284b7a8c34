"""Slow clients on the HTTP endpoints (issue 17 case 14): the plugin's /metrics, /healthz, /readyz and
the config-manager's. A request must arrive within 3 s; at most 32 connections are handled at once, a
new one closing the oldest still sending its request, so the kubelet's probes are answered while slow
clients hang around. Real sockets, the endpoints in process."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from nvdp.base import http_endpoint
from nvdp.plugins.metrics import HttpEndpoint, Metrics
from nvdp.side.configmanager.status import Snapshot, StatusServer
from testkit import wait_until

DEADLINE_S = 3.0  # docs/hardening.md: a request (its line and headers) must arrive within 3 s
CONNECTIONS = 32  # handled at once
SHORT_S = 1.0  # the deadline the tests that wait it out run with (the endpoints are in this process)


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_endpoint, "REQUEST_DEADLINE_S", SHORT_S)


class Pages:
    """Fixed pages; /readyz blocks while `hold` is clear (a slow readiness check)."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self._lock = threading.Lock()
        self.held = 0  # /readyz requests waiting on `hold` now

    def render_metrics(self, peer: str) -> bytes:
        return b"x 1\n"

    def liveness_problem(self) -> str | None:
        return None

    def readiness_problem(self) -> str | None:
        with self._lock:
            self.held += 1
        try:
            self.hold.wait(10)
        finally:
            with self._lock:
                self.held -= 1
        return None

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        return None


Serve = Callable[[], tuple[int, Callable[[], None]]]  # -> (port, stop)


def serve_plugin_metrics() -> tuple[int, Callable[[], None]]:
    metrics = Metrics("127.0.0.1:0")
    metrics.start()
    return metrics.port, metrics.stop


def serve_config_manager_status() -> tuple[int, Callable[[], None]]:
    status = StatusServer("127.0.0.1:0", lambda: Snapshot(True, 1, 0, 0, 0.0), alarm_after=60.0).start()
    return status.port, status.stop


@pytest.fixture
def endpoint() -> Iterator[tuple[int, Pages]]:
    pages = Pages()
    endpoint = HttpEndpoint("127.0.0.1:0", pages)
    endpoint.start()
    yield endpoint.port, pages
    pages.hold.set()
    endpoint.stop()


def get(port: int, path: str, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return b"".join(iter(lambda: connection.recv(65536), b""))


def closed_by_server(connection: socket.socket) -> bool:
    """True when the server has closed `connection` (what it sent before, e.g. a 408, is read)."""
    try:
        while select.select([connection], [], [], 0)[0]:
            if not connection.recv(65536):
                return True
    except OSError:
        return True
    return False


@pytest.mark.parametrize(
    "serve", [serve_plugin_metrics, serve_config_manager_status], ids=["plugin", "config-manager"]
)
def test_a_client_sending_a_header_line_at_a_time_is_cut_off_at_the_deadline(serve: Serve) -> None:
    port, stop = serve()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            started = time.monotonic()
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")
            reply = b""
            while time.monotonic() - started < SHORT_S + 3.0:
                try:
                    slow.sendall(b"X-Slow: 1\r\n")  # one header line every 0.2 s, never the end
                except OSError:
                    break
                if select.select([slow], [], [], 0.2)[0]:
                    chunk = slow.recv(65536)
                    reply += chunk
                    if not chunk:
                        break
            cut_after = time.monotonic() - started
        assert SHORT_S - 0.2 < cut_after < SHORT_S + 1.5, f"cut off after {cut_after:.1f}s"
        assert reply == b"" or reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert get(port, "/healthz").startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        stop()


def test_the_deadline_is_the_documented_one() -> None:
    from nvdp.base.http_endpoint import MAX_CONNECTIONS
    from nvdp.base.timers import Timers

    assert (Timers().request_deadline, MAX_CONNECTIONS) == (DEADLINE_S, CONNECTIONS)


def test_probes_answer_while_fifty_slow_clients_are_connected(endpoint: tuple[int, Pages]) -> None:
    port, _ = endpoint
    threads_before = threading.active_count()
    slow: list[tuple[float, socket.socket]] = []
    try:
        for _ in range(50):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: 1\r\n")  # and nothing more
            slow.append((time.monotonic(), connection))
        started = time.monotonic()
        for path in ("/healthz", "/readyz"):  # the kubelet's probes (1 s timeout by default)
            assert get(port, path, timeout=1.0).startswith(b"HTTP/1.1 200 OK\r\n")
        assert time.monotonic() - started < 1.0
        assert threading.active_count() - threads_before <= CONNECTIONS + 1, "a thread per slow client"
        # Every slow client is closed: the oldest ones at once (room for newer connections), the
        # rest at the deadline.
        wait_until(
            lambda: all(closed_by_server(c) for _, c in slow), timeout=SHORT_S + 2, what="slow clients cut"
        )
        assert time.monotonic() - slow[-1][0] < SHORT_S + 2
    finally:
        for _, connection in slow:
            connection.close()


def test_with_every_connection_answering_a_new_one_is_closed_at_once(endpoint: tuple[int, Pages]) -> None:
    port, pages = endpoint
    pages.hold.clear()  # /readyz takes its time: the connections are answering, none can be closed
    replies: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: replies.append(get(port, "/readyz", timeout=10)))
        for _ in range(CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    extra: socket.socket | None = None
    try:
        # this endpoint's own count: another test's connection threads may still be ending
        wait_until(lambda: pages.held == CONNECTIONS, timeout=5, what="every connection answering")
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert extra.recv(65536) == b"", "closed without a reply"
    finally:
        pages.hold.set()
        for thread in threads:
            thread.join(10)
        if extra is not None:
            extra.close()
    assert len(replies) == CONNECTIONS and all(r.startswith(b"HTTP/1.1 200 OK\r\n") for r in replies)
