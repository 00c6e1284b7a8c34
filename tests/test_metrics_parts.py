"""The parts of nvdp.plugins.metrics through their seams, with hand-written fakes: readiness over a
registration state, the metrics over an endpoint, the HTTP endpoint over pages. The real daemon is in
test_metrics.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

import pytest

from nvdp.base.errors import NvmlError
from nvdp.node.nvml import open_nvml
from nvdp.plugins.metrics import HttpEndpoint, MetricFamilies, Metrics, Pages, Probes
from tests.fakes import BrokenNvml, FakeHealth, FakeHttpEndpoint, FakeSupervisor

A, B = "nvidia.com/a", "nvidia.com/b"


RUNNING, STOPPED, NONE, OFF = FakeHealth(True, True), FakeHealth(True, False), FakeHealth(True, None), None


@pytest.mark.parametrize(
    ("registered", "served", "health", "problem"),
    [
        (None, True, RUNNING, "starting: no resources served yet"),
        ({A: False}, False, RUNNING, "starting: no resources served yet"),
        ({}, True, STOPPED, None),
        ({B: False, A: False}, True, RUNNING, f"not registered: {A}, {B}"),
        ({A: True, B: False}, True, RUNNING, f"not registered: {B}"),
        ({A: True}, True, RUNNING, None),
        ({A: True}, True, STOPPED, "health monitor not running"),
        ({A: True}, True, NONE, "health monitor not running"),
        ({A: True}, True, FakeHealth(False, False), None),
        ({A: True}, True, OFF, None),
    ],
    ids=[
        "no-supervisor-yet",
        "supervisor-not-applied-yet",
        "nothing-to-serve",
        "none-registered-sorted",
        "one-missing",
        "all-registered",
        "monitor-stopped",
        "monitor-not-created",
        "health-checks-off",
        "no-health-attached",
    ],
)
def test_readiness(
    registered: Mapping[str, bool] | None, served: bool, health: FakeHealth | None, problem: str | None
) -> None:
    supervisor = None if registered is None else FakeSupervisor(registered, started=served)
    probes = Probes(supervisor, health)
    assert probes.readiness_problem() == problem
    assert probes.liveness_problem() is None


def test_readiness_reads_the_supervisor_at_probe_time() -> None:
    supervisor = FakeSupervisor({A: False})
    probes = Probes(supervisor)
    assert probes.readiness_problem() == f"not registered: {A}"
    supervisor.registered[A] = True
    assert probes.readiness_problem() is None


def test_metrics_serve_through_the_endpoint_protocol() -> None:
    made: list[FakeHttpEndpoint] = []

    def factory(address: str, pages: Pages) -> FakeHttpEndpoint:
        made.append(FakeHttpEndpoint(address, pages))
        return made[-1]

    metrics = Metrics(":9400", MetricFamilies("9.9"), endpoint=factory)
    (endpoint,) = made
    assert (endpoint.address, endpoint.pages, metrics.port) == (":9400", metrics, 0)
    metrics.start()
    assert metrics.port == 4242
    metrics.stop()
    assert endpoint.calls == ["start", "stop"]
    assert b'\nnvdp_build_info{version="9.9"} 1\n' in endpoint.pages.render_metrics("127.0.0.1")
    assert endpoint.pages.readiness_problem() == "starting: no resources served yet"


def test_failed_nvml_calls_are_counted_by_call() -> None:
    metrics = Metrics(":0")
    nvml = metrics.families.count_nvml_errors(BrokenNvml())  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(NvmlError):
            nvml.init()
    assert b'\nnvdp_nvml_errors_total{call="nvmlInit_v2"} 2\n' in metrics.render_metrics("127.0.0.1")


def test_a_counted_event_set_passes_an_interrupt_on() -> None:
    """The health monitor ends a wait on the event set it was given, which is this wrapper."""
    nvml = Metrics(":0").families.count_nvml_errors(open_nvml("sim:pcie-4"))
    nvml.init()
    try:
        event_set = nvml.create_event_set()
        event_set.interrupt()
        started = time.monotonic()
        assert event_set.wait(30_000) is None
        assert time.monotonic() - started < 5.0
        event_set.close()
    finally:
        nvml.shutdown()


class FixedPages:
    def render_metrics(self, peer: str) -> bytes:
        return b"x 1\n"

    def liveness_problem(self) -> str | None:
        return None

    def readiness_problem(self) -> str | None:
        return "waiting"

    def extra_page(self, path: str, peer: str) -> tuple[str, bytes] | None:
        return {"/page": ("application/json", b"{}\n")}.get(path)


def test_http_endpoint_serves_its_pages() -> None:
    endpoint = HttpEndpoint("127.0.0.1:0", FixedPages())
    endpoint.start()
    try:
        replies = {}
        for path in ("/metrics", "/healthz", "/readyz", "/page", "/other"):
            with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as connection:
                connection.sendall(f"GET {path} HTTP/1.1\r\n\r\n".encode())
                reply = b"".join(iter(lambda: connection.recv(65536), b""))
            head, _, body = reply.partition(b"\r\n\r\n")
            replies[path] = (head.split(b"\r\n")[0], body)
            if path == "/page":
                assert b"\r\nContent-Type: application/json\r\n" in head
    finally:
        endpoint.stop()
    assert replies == {
        "/metrics": (b"HTTP/1.1 200 OK", b"x 1\n"),
        "/healthz": (b"HTTP/1.1 200 OK", b"ok\n"),
        "/readyz": (b"HTTP/1.1 503 Service Unavailable", b"waiting\n"),
        "/page": (b"HTTP/1.1 200 OK", b"{}\n"),  # a page of the command's own (the plugin's /allocations)
        "/other": (b"HTTP/1.1 404 Not Found", b"not found: try /metrics, /healthz or /readyz\n"),
    }
