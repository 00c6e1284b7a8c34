"""/metrics, /healthz and /readyz of a real daemon (simulated dgx-a100, kubelet stand-in, real sockets).

The daemon runs in-process on a thread with metrics on 127.0.0.1:0. Every wait polls a condition with
a deadline; nothing sleeps for a fixed time. Every scrape is parsed and checked by `parse_families`
(our own reader of the text format 0.0.4); `nvdp.base.promtext` has exact-text tests of its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import threading
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from nvdp.base.errors import ConfigError, NvdpError
from nvdp.base.logs import JsonFormatter, TextFormatter, log_event
from nvdp.base.promtext import CONTENT_TYPE, Counter, Gauge, Histogram, MetricFamily, Registry, render
from nvdp.config import PluginOptions, resolve
from nvdp.node.health import xid_reason
from nvdp.plugins.deviceplugin.daemon import Daemon
from nvdp.plugins.metrics import Metrics, Probes, parse_address
from nvdp.sim.kubelet import Kubelet
from testkit import REPO, wait_until
from tests.builders import append_sim_event, resource
from tests.fakes import BrokenNvml, FakeServer, FakeSupervisor
from tests.readings import http_get

GPU = "nvidia.com/gpu"
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
COMMENT = re.compile(r"^# (HELP|TYPE) (\w+) (.*)$")
VALUE = re.compile(r"[+-]Inf|NaN|-?\d+(\.\d+)?(e[+-]\d+)?")
Sample = tuple[str, dict[str, str], float]


# ---- helpers ------------------------------------------------------------------------------------


@dataclass
class Family:
    name: str
    help: str
    type: str = ""
    samples: list[Sample] = field(default_factory=list)


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], text)


def parse_families(text: str) -> dict[str, Family]:
    """Read a text exposition (format 0.0.4) and check its shape: `# HELP` then `# TYPE` once per family,
    then only that family's samples; label blocks well-formed; histogram buckets cumulative, +Inf last
    and equal to _count."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, Family] = {}
    family: Family | None = None
    for line in text.splitlines():
        comment = COMMENT.match(line)
        if comment:
            kind, name, rest = comment.groups()
            if kind == "HELP":
                assert name not in families, f"family {name} exposed twice"
                family = families[name] = Family(name, unescape(rest))
            else:
                assert family is not None and family.name == name and not family.type, f"stray {line!r}"
                family.type = rest
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, block, value = match.groups()
        assert family is not None and family.type, f"sample before HELP and TYPE: {line!r}"
        suffixes = ("_bucket", "_count", "_sum") if family.type == "histogram" else ()
        assert name in {family.name, *(family.name + s for s in suffixes)}, f"{name} outside its family"
        pairs = LABEL.findall(block or "")
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == (block or ""), f"bad labels: {line!r}"
        assert VALUE.fullmatch(value), f"bad value: {line!r}"
        family.samples.append((name, {k: unescape(v) for k, v in pairs}, float(value)))
    for family in families.values():
        if family.type == "histogram":
            check_histogram(family)
    return families


def check_histogram(family: Family) -> None:
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for name, labels, count in family.samples:
        series = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        if name.endswith("_bucket"):
            buckets.setdefault(series, []).append((float(labels["le"]), count))
        elif name.endswith("_count"):
            counts[series] = count
    assert buckets.keys() == counts.keys(), f"{family.name}: every series has buckets and a count"
    for series, found in buckets.items():
        bounds, cumulative = [b for b, _ in found], [c for _, c in found]
        assert bounds == sorted(set(bounds)) and bounds[-1] == math.inf, f"{family.name}{series}: {bounds}"
        assert cumulative == sorted(cumulative), f"{family.name}{series}: not cumulative: {cumulative}"
        assert cumulative[-1] == counts[series], f"{family.name}{series}: +Inf != _count"


def parse_metrics(text: str) -> list[Sample]:
    return [sample for family in parse_families(text).values() for sample in family.samples]


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample `name` whose labels include `labels`; None when there is none."""
    found = [v for n, ls, v in parse_metrics(text) if n == name and labels.items() <= ls.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def sim_daemon(
    sock_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    reload_config: Callable[[], PluginOptions] | None = None,
    nvml: object = None,
    **flags: str,
) -> Daemon:
    """A Daemon on the simulated dgx-a100 with metrics on an ephemeral port; `flags` are plugin flags."""
    flags = {
        "nvml": "sim:dgx-a100",
        "kubelet_socket": str(sock_dir / "kubelet.sock"),
        "metrics_address": "127.0.0.1:0",
        **flags,
    }
    args, env = argparse.Namespace(**flags), dict(environ or {})
    if "NVDP_SIM_EVENTS" in os.environ:  # set by the `events` fixture; the daemon reads its own environ
        env.setdefault("NVDP_SIM_EVENTS", os.environ["NVDP_SIM_EVENTS"])
    reload_config = reload_config or (lambda: resolve(args, env))
    return Daemon(resolve(args, env), environ=env, reload_config=reload_config, nvml=nvml)  # type: ignore[arg-type]


class Plugin:
    """A Daemon running on a thread."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-daemon", daemon=True)

    def _run(self) -> None:
        try:
            self.daemon.run()
        except BaseException as error:  # reported by stop()
            self.error = error

    def start(self) -> Plugin:
        """Start and wait until the servers are up (a kubelet starting then cleans up no half-made socket)."""
        self._thread.start()
        wait_until(lambda: self.metrics.port or self.error, timeout=10, what="metrics port")
        self.wait_for("/readyz", lambda _, body: not body.startswith("starting"), "servers")
        return self

    def stop(self) -> None:
        self.daemon.request_stop()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the daemon did not stop"
        assert self.error is None, "".join(traceback.format_exception(self.error))

    @property
    def metrics(self) -> Metrics:
        assert self.daemon.metrics is not None
        return self.daemon.metrics

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.metrics.port, path)

    def wait_for(self, path: str, predicate: Callable[[int, str], object], what: str) -> tuple[int, str]:
        """Poll `path` until predicate(status, body) holds (deadline 10 s); return the last answer."""
        last: list[tuple[int, str]] = []

        def check() -> object:
            last[:] = [self.get(path)]
            return predicate(*last[0])

        try:
            wait_until(check, timeout=10.0, what=what)
        except TimeoutError as error:
            raise TimeoutError(f"{error}; last answer: {last}") from None
        return last[0]

    def wait_metric(self, name: str, expected: float, **labels: str) -> str:
        _, text = self.wait_for(
            "/metrics", lambda _, t: value(t, name, **labels) == expected, f"{name}{labels} == {expected}"
        )
        return text


@pytest.fixture
def events(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = sock_dir / "events.jsonl"
    path.touch()
    monkeypatch.setenv("NVDP_SIM_EVENTS", str(path))  # read by the simulated backend when it opens
    return path


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[Kubelet]:
    kubelet = Kubelet(sock_dir)
    yield kubelet
    kubelet.stop()


@pytest.fixture
def plugin(sock_dir: Path, events: Path) -> Iterator[Plugin]:
    plugin = Plugin(sim_daemon(sock_dir)).start()
    yield plugin
    plugin.stop()


def registered(plugin: Plugin, kubelet: Kubelet) -> None:
    kubelet.wait_for_registration(GPU)
    kubelet.wait_for_devices(GPU)
    plugin.wait_for("/readyz", lambda code, _: code == 200, "ready")


# ---- probes -------------------------------------------------------------------------------------


def test_readyz_follows_registration_and_the_kubelet(plugin: Plugin, kubelet: Kubelet) -> None:
    assert plugin.wait_for("/readyz", lambda code, body: "not registered" in body, "not registered") == (
        503,
        f"not registered: {GPU}\n",
    )
    assert plugin.get("/healthz") == (200, "ok\n")

    kubelet.start()
    assert plugin.wait_for("/readyz", lambda code, _: code == 200, "ready") == (200, "ok\n")

    kubelet.stop()  # kubelet.sock disappears
    unready = plugin.wait_for("/readyz", lambda code, _: code == 503, "unready")
    assert unready == (503, f"not registered: {GPU}\n")
    assert plugin.get("/healthz") == (200, "ok\n")  # waiting for the kubelet is not a reason to restart

    kubelet.start()
    plugin.wait_for("/readyz", lambda code, _: code == 200, "ready again")
    kubelet.restart()  # wipes the plugin sockets: the servers restart and register again
    kubelet.wait_for_registration(GPU, count=3)
    plugin.wait_for("/readyz", lambda code, _: code == 200, "ready after the restart")
    assert plugin.get("/healthz") == (200, "ok\n")
    text = plugin.wait_metric("nvdp_kubelet_registrations_total", 2, resource=GPU, kind="re-registration")
    assert value(text, "nvdp_kubelet_registrations_total", resource=GPU, kind="first") == 1


def test_readyz_needs_a_running_health_monitor(plugin: Plugin, kubelet: Kubelet) -> None:
    kubelet.start()
    registered(plugin, kubelet)
    assert plugin.daemon.health.monitor is not None
    plugin.daemon.health.monitor.stop()
    assert plugin.get("/readyz") == (503, "health monitor not running\n")


def test_readyz_without_health_checks(sock_dir: Path, events: Path, kubelet: Kubelet) -> None:
    plugin = Plugin(sim_daemon(sock_dir, environ={"DP_DISABLE_HEALTHCHECKS": "all"})).start()
    try:
        kubelet.start()
        registered(plugin, kubelet)
        status = plugin.daemon.health.monitor_status()
        assert status is not None and not status.running
    finally:
        plugin.stop()


def test_idling_without_nvml_is_ready(sock_dir: Path) -> None:
    """fail-on-init-error=false: the plugin idles on purpose; a DaemonSet rollout must not wait on it."""
    plugin = Plugin(
        sim_daemon(sock_dir, nvml=BrokenNvml("NVML_ERROR_LIBRARY_NOT_FOUND"), fail_on_init_error="false")
    ).start()
    try:
        assert plugin.get("/readyz") == (200, "ok\n")
        text = plugin.get("/metrics")[1]
        assert value(text, "nvdp_nvml_errors_total", call="nvmlInit_v2") == 1
        assert value(text, "nvdp_devices") is None
    finally:
        plugin.stop()


def test_healthz_fails_when_a_registered_socket_stays_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeServer(resource(GPU), Path("/dp/nvidia-gpu.sock"))
    server.start()
    supervisor = FakeSupervisor({GPU: False}, {GPU: server})
    metrics = Metrics("127.0.0.1:0", probes=Probes(supervisor))  # type: ignore[arg-type]
    metrics.families.servers_changed({GPU: server})
    supervisor.registered[GPU] = True
    metrics.families.registered(GPU, True)
    assert metrics.liveness_problem() is None
    server.wiped = True  # its socket file is gone
    assert metrics.liveness_problem() is None  # within the grace period: being restarted
    monkeypatch.setattr("nvdp.plugins.metrics.readiness.SOCKET_GRACE_S", 0.0)
    assert metrics.liveness_problem() == "plugin socket missing for over 0s: /dp/nvidia-gpu.sock"
    supervisor.registered[GPU] = False  # the kubelet went away: the supervisor restarts the server
    metrics.families.kubelet_lost()  # when it is back
    assert metrics.liveness_problem() is None


# ---- /metrics -----------------------------------------------------------------------------------


def test_rpc_counters_and_latency_are_exact(plugin: Plugin, kubelet: Kubelet) -> None:
    kubelet.start()
    registered(plugin, kubelet)
    ids = sorted(kubelet.devices(GPU))
    for n in range(5):
        kubelet.allocate(GPU, [[ids[n]]])
    for bad in (["GPU-nope"], []):
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.allocate(GPU, [bad])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(kubelet.preferred_allocation(GPU, ids, [], 2)) == 2

    text = plugin.wait_metric(
        "nvdp_grpc_request_duration_seconds_count", 2, resource=GPU, method="Allocate", result="error"
    )
    requests = "nvdp_grpc_requests_total"
    assert value(text, requests, resource=GPU, method="Allocate", code="OK") == 5
    assert value(text, requests, resource=GPU, method="Allocate", code="INVALID_ARGUMENT") == 2
    assert value(text, requests, resource=GPU, method="GetPreferredAllocation", code="OK") == 1
    duration = "nvdp_grpc_request_duration_seconds"
    assert value(text, f"{duration}_bucket", resource=GPU, method="Allocate", result="ok", le="+Inf") == 5
    assert value(text, f"{duration}_count", resource=GPU, method="Allocate", result="ok") == 5
    seconds = value(text, f"{duration}_sum", resource=GPU, method="Allocate", result="ok")
    assert seconds is not None and 0 < seconds < 5
    assert value(text, "nvdp_devices", resource=GPU, sharing="none") == 8
    assert value(text, "nvdp_listandwatch_streams", resource=GPU) == 1
    assert value(text, "nvdp_build_info", version="0.1.0") == 1
    assert value(text, "nvdp_health_monitor_degraded") == 0
    assert value(text, "nvdp_config_reloads_total", result="success") == 0
    assert [v for n, _, v in parse_metrics(text) if n == "nvdp_device_healthy"] == [1.0] * 8
    names = {n for n, _, _ in parse_metrics(text)}
    assert not any(n.endswith("_created") for n in names)
    assert {name: f.type for name, f in parse_families(text).items()} == {
        "nvdp_grpc_requests_total": "counter",
        "nvdp_grpc_request_duration_seconds": "histogram",
        "nvdp_kubelet_registrations_total": "counter",
        "nvdp_config_reloads_total": "counter",
        "nvdp_nvml_errors_total": "counter",
        "nvdp_build_info": "gauge",
        "nvdp_device_healthy": "gauge",
        "nvdp_devices": "gauge",
        "nvdp_listandwatch_streams": "gauge",
        "nvdp_health_events_total": "counter",
        "nvdp_health_monitor_degraded": "gauge",
        "nvdp_node_misfits": "gauge",
        "nvdp_node_misfits_total": "counter",
        "nvdp_device_allocated": "gauge",  # no sample: no PodResources socket beside this kubelet dir
        "nvdp_device_layout_changes_total": "counter",
    }
    assert value(text, "nvdp_device_layout_changes_total", kind="mig") == 0


def test_xid_and_nvml_errors_show_up(plugin: Plugin, kubelet: Kubelet, events: Path) -> None:
    kubelet.start()
    registered(plugin, kubelet)
    uuid = sorted(kubelet.devices(GPU))[3]
    append_sim_event(events, uuid=uuid, xid=79)
    text = plugin.wait_metric("nvdp_device_healthy", 0, resource=GPU, device=uuid, reason=xid_reason(79))
    assert value(text, "nvdp_health_events_total", xid="79") == 1
    healthy = {ls["device"]: v for n, ls, v in parse_metrics(text) if n == "nvdp_device_healthy"}
    assert healthy == {i: float(i != uuid) for i in kubelet.devices(GPU)}

    append_sim_event(events, event="wait-error", code="NVML_ERROR_UNKNOWN")  # a failed nvmlEventSetWait
    plugin.wait_metric("nvdp_nvml_errors_total", 1, call="nvmlEventSetWait_v2")
    assert plugin.wait_metric("nvdp_health_monitor_degraded", 0)  # re-armed after the failed wait


def test_reloads_are_counted_by_result(sock_dir: Path, events: Path, kubelet: Kubelet) -> None:
    outcomes = iter([True, False])
    args = argparse.Namespace(nvml="sim:dgx-a100", kubelet_socket=str(sock_dir / "kubelet.sock"))

    def reload_config() -> PluginOptions:
        if next(outcomes):
            return resolve(args, {})
        raise ConfigError(["config.yaml: not YAML"])

    plugin = Plugin(sim_daemon(sock_dir, reload_config=reload_config)).start()
    try:
        kubelet.start()
        registered(plugin, kubelet)
        plugin.daemon.request_reload()
        plugin.wait_metric("nvdp_config_reloads_total", 1, result="success")
        plugin.daemon.request_reload()
        text = plugin.wait_metric("nvdp_config_reloads_total", 1, result="failure")
        assert value(text, "nvdp_config_reloads_total", result="success") == 1
        assert plugin.get("/readyz") == (200, "ok\n")  # still serving the previous configuration
    finally:
        plugin.stop()


# ---- the exposition (nvdp.base.promtext) -------------------------------------------------------------

EXPECTED_EXPOSITION = r"""# HELP t_requests_total Requests with "quotes", a \\ backslash\nand a newline.
# TYPE t_requests_total counter
t_requests_total{path="a\"b\\c\nd",code="OK"} 2
t_requests_total{path="",code="OK"} 1
# HELP t_value Values as Go spells them.
# TYPE t_value gauge
t_value{kind="inf"} +Inf
t_value{kind="-inf"} -Inf
t_value{kind="nan"} NaN
t_value{kind="half"} 0.5
t_value{kind="integral"} 3
t_value{kind="negative"} -2
t_value{kind="tiny"} 1e-05
t_value{kind="huge"} 1e+21
# HELP t_seconds Latency.
# TYPE t_seconds histogram
t_seconds_bucket{le="0.5"} 2
t_seconds_bucket{le="1"} 3
t_seconds_bucket{le="+Inf"} 4
t_seconds_count 4
t_seconds_sum 5.75
# HELP t_up Unlabelled: exposed at 0 before any update.
# TYPE t_up gauge
t_up 0
# HELP t_state Read at scrape time.
# TYPE t_state gauge
t_state{resource="r"} 7
"""


class _StateCollector:
    def collect(self) -> list[MetricFamily]:
        family = MetricFamily("t_state", "Read at scrape time.", "gauge", ["resource"])
        family.add(["r"], 7)
        return [family]


def test_exposition_text_is_exact() -> None:
    registry = Registry()
    odd = 'a"b\\c\nd'
    requests = registry.register(
        Counter(
            "t_requests_total", 'Requests with "quotes", a \\ backslash\nand a newline.', ["path", "code"]
        )
    )
    requests.labels(odd, "OK").inc(2)
    requests.labels("", "OK").inc()
    values = registry.register(Gauge("t_value", "Values as Go spells them.", ["kind"]))
    for kind, number in [
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("nan", math.nan),
        ("half", 0.5),
        ("integral", 3),
        ("negative", -2.0),
        ("tiny", 1e-05),
        ("huge", 1e21),
    ]:
        values.labels(kind).set(number)
    seconds = registry.register(Histogram("t_seconds", "Latency.", buckets=(0.5, 1)))
    for observed in (0.25, 0.5, 1, 4):  # 0.5 and 1 land on a bound: `le` is inclusive
        seconds.labels().observe(observed)
    registry.register(Gauge("t_up", "Unlabelled: exposed at 0 before any update."))
    registry.register(_StateCollector())

    text = registry.render().decode()
    assert text == EXPECTED_EXPOSITION
    families = parse_families(text)  # and our reader gets the original strings back
    assert families["t_requests_total"].help == 'Requests with "quotes", a \\ backslash\nand a newline.'
    assert families["t_requests_total"].samples[0] == ("t_requests_total", {"path": odd, "code": "OK"}, 2.0)
    assert math.isnan(families["t_value"].samples[2][2])


@pytest.mark.parametrize(
    ("misuse", "error"),
    [
        (lambda: Counter("t_total", "h", ["a"]).labels("x", "y"), "expected labels"),
        (lambda: Counter("t_total", "h", ["a"]).labels(), "expected labels"),
        (lambda: Counter("t-total", "h"), "invalid metric"),
        (lambda: Gauge("t", "h", ["bad-label"]), "invalid metric"),
        (lambda: Histogram("t", "h", ["le"], buckets=(1,)), "invalid metric"),
        (lambda: Histogram("t", "h", buckets=(2, 1)), "ascending"),
        (lambda: Histogram("t", "h", buckets=()), "ascending"),
        (lambda: Counter("t_total", "h").labels().inc(-1), "only goes up"),
        (lambda: render([MetricFamily("t", "h", "gauge"), MetricFamily("t", "h", "gauge")]), "twice"),
        (lambda: MetricFamily("t", "h", "gauge", ["a"]).add([], 1), "shorter"),
    ],
    ids=[
        "too-many-labels",
        "too-few-labels",
        "metric-name",
        "label-name",
        "le-reserved",
        "unsorted-buckets",
        "no-buckets",
        "counter-down",
        "family-twice",
        "snapshot-labels",
    ],
)
def test_misuse_is_refused(misuse: Callable[[], object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        misuse()


def test_concurrent_updates_are_counted_exactly_and_scraped_consistently() -> None:
    registry = Registry()
    requests = registry.register(Counter("t_total", "h", ["code"]))
    seconds = registry.register(Histogram("t_seconds", "h", ["code"], buckets=(0.001, 0.01)))
    threads, rounds = 8, 5000
    stop = threading.Event()
    scrapes: list[str] = []

    def work() -> None:
        count, latency = requests.labels("OK"), seconds.labels("OK")
        for n in range(rounds):
            latency.observe(0.02 if n % 2 else 0.0005)
            count.inc()

    def scrape() -> None:
        while not stop.is_set():
            scrapes.append(registry.render().decode())

    scraper = threading.Thread(target=scrape)
    scraper.start()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    scraper.join()
    for text in scrapes:  # each one consistent: cumulative buckets, +Inf == _count
        parse_families(text)
    text = registry.render().decode()
    total = threads * rounds
    assert value(text, "t_total", code="OK") == total
    assert value(text, "t_seconds_count", code="OK") == total
    assert value(text, "t_seconds_bucket", code="OK", le="0.001") == total / 2
    assert value(text, "t_seconds_sum", code="OK") == pytest.approx(total / 2 * 0.0205)


# ---- the HTTP endpoint --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":2112", ("", 2112)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9400", ("::1", 9400)),
        ("localhost:80", ("localhost", 80)),
    ],
    ids=["all-interfaces", "ephemeral", "ipv6", "hostname"],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


def test_endpoint_lifecycle() -> None:
    metrics = Metrics("127.0.0.1:0")
    metrics.start()
    port = metrics.port
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/nope", timeout=5)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as starting:
        urllib.request.urlopen(f"{url}/readyz", timeout=5)
    assert starting.value.read() == b"starting: no resources served yet\n"

    busy = Metrics(f"127.0.0.1:{port}")
    with pytest.raises(NvdpError, match=f"cannot listen on metrics address '127.0.0.1:{port}'"):
        busy.start()

    metrics.stop()
    metrics.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_metrics_off_binds_nothing_and_never_imports_the_metrics_module(sock_dir: Path) -> None:
    assert sim_daemon(sock_dir, metrics_address="").metrics is None
    code = (
        "import sys, nvdp.cli, nvdp.plugins.deviceplugin.daemon; "
        "sys.exit('prometheus_client' in sys.modules or 'nvdp.plugins.metrics' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


def exchange(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send raw bytes; return the status line, the headers and the body (the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(request)
        reply = b"".join(iter(lambda: connection.recv(65536), b""))
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    if "Content-Length" in headers and not request.startswith(b"HEAD"):
        assert int(headers["Content-Length"]) == len(body)
    return status, headers, body


@pytest.fixture
def endpoint() -> Iterator[Metrics]:
    metrics = Metrics("127.0.0.1:0")
    metrics.start()
    yield metrics
    metrics.stop()


@pytest.mark.parametrize(
    ("request_line", "status", "content_type"),
    [
        ("GET /metrics HTTP/1.1", "HTTP/1.1 200 OK", CONTENT_TYPE),
        ("GET /metrics?name[]=x HTTP/1.0", "HTTP/1.1 200 OK", CONTENT_TYPE),
        ("GET /healthz HTTP/1.1", "HTTP/1.1 200 OK", "text/plain; charset=utf-8"),
        ("GET /readyz HTTP/1.1", "HTTP/1.1 503 Service Unavailable", "text/plain; charset=utf-8"),
        ("GET /nope HTTP/1.1", "HTTP/1.1 404 Not Found", "text/plain; charset=utf-8"),
        ("GET /metrics/ HTTP/1.1", "HTTP/1.1 404 Not Found", "text/plain; charset=utf-8"),
        ("POST /metrics HTTP/1.1", "HTTP/1.1 405 Method Not Allowed", "text/plain; charset=utf-8"),
        ("DELETE /healthz HTTP/1.1", "HTTP/1.1 405 Method Not Allowed", "text/plain; charset=utf-8"),
        ("hello", "HTTP/1.1 400 Bad Request", "text/plain; charset=utf-8"),
        ("GET /metrics", "HTTP/1.1 400 Bad Request", "text/plain; charset=utf-8"),
    ],
    ids=[
        "metrics",
        "query",
        "healthz",
        "readyz",
        "unknown",
        "trailing-slash",
        "post",
        "delete",
        "garbage",
        "no-version",
    ],
)
def test_http_answers(endpoint: Metrics, request_line: str, status: str, content_type: str) -> None:
    request = f"{request_line}\r\nHost: x\r\nAccept: */*\r\n\r\n".encode()
    got_status, headers, body = exchange(endpoint.port, request)
    assert (got_status, headers["Content-Type"], headers["Connection"]) == (status, content_type, "close")
    if status.endswith("Method Not Allowed"):
        assert headers["Allow"] == "GET, HEAD"
    if content_type == CONTENT_TYPE:
        assert value(body.decode(), "nvdp_build_info", version="0.1.0") == 1


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/nope"], ids=["metrics", "healthz", "unknown"])
def test_head_has_the_headers_of_get_and_no_body(endpoint: Metrics, path: str) -> None:
    get = exchange(endpoint.port, f"GET {path} HTTP/1.1\r\n\r\n".encode())
    head = exchange(endpoint.port, f"HEAD {path} HTTP/1.1\r\n\r\n".encode())
    assert head == (get[0], get[1], b"")


def test_bad_clients_do_not_stop_the_endpoint(endpoint: Metrics) -> None:
    port = endpoint.port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # a TCP probe
    many_headers = b"GET /metrics HTTP/1.1\r\n" + b"X-Header: y\r\n" * 200 + b"\r\n"
    long_line = b"GET /" + b"x" * 100_000 + b" HTTP/1.1\r\n\r\n"
    with_body = b"POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000
    assert exchange(port, many_headers)[0] == "HTTP/1.1 431 Request Header Fields Too Large"
    assert exchange(port, long_line)[0] == "HTTP/1.1 400 Bad Request"
    assert exchange(port, with_body)[0] == "HTTP/1.1 405 Method Not Allowed"
    assert exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")[0] == "HTTP/1.1 200 OK"


NO_SSL = """
import socket, sys
sys.modules["ssl"] = sys.modules["_hashlib"] = None  # imports now fail, as in the plugin process
import nvdp.plugins.deviceplugin.daemon, nvdp.plugins.metrics
metrics = nvdp.plugins.metrics.Metrics("127.0.0.1:0")
metrics.start()
with socket.create_connection(("127.0.0.1", metrics.port), timeout=5) as connection:
    connection.sendall(b"GET /metrics HTTP/1.1\\r\\n\\r\\n")
    reply = b"".join(iter(lambda: connection.recv(65536), b""))
metrics.stop()
metrics.stop()
assert reply.startswith(b"HTTP/1.1 200 OK\\r\\n") and b"\\nnvdp_build_info{" in reply, reply
heavy = ("ssl", "_hashlib", "http.client", "http.server", "email", "prometheus_client")
loaded = [m for m in heavy if sys.modules.get(m)]
assert not loaded, loaded
"""


def test_metrics_need_no_ssl_nor_http_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_SSL], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# ---- logging ------------------------------------------------------------------------------------


def test_allocate_logs_only_refusals(
    plugin: Plugin, kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.start()
    registered(plugin, kubelet)
    ids = sorted(kubelet.devices(GPU))
    caplog.set_level(logging.INFO)
    for device in ids:
        kubelet.allocate(GPU, [[device]])
    kubelet.preferred_allocation(GPU, ids, [], 4)
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(GPU, [["GPU-nope"]])
    plugin.wait_metric(
        "nvdp_grpc_requests_total", 1, resource=GPU, method="Allocate", code="INVALID_ARGUMENT"
    )
    ours = [
        r
        for r in caplog.records
        if r.name.startswith("nvdp.") and not r.name.startswith("nvdp.plugins.kubeletplugin")
    ]
    lines = [TextFormatter().format(r).split(" ", 1)[1] for r in ours]
    assert lines == [
        f'WARNING request refused resource={GPU} method=Allocate error="{GPU}: unknown device IDs: GPU-nope"'
    ]


def test_structured_fields_are_json_in_text_and_objects_in_json(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    log_event(logging.getLogger("nvdp.test"), logging.INFO, "starting nvdp", config={"a": [1, "b c"]}, n=2)
    record = caplog.records[-1]
    assert TextFormatter().format(record).endswith('INFO    starting nvdp config={"a":[1,"b c"]} n=2')
    assert json.loads(JsonFormatter().format(record))["config"] == {"a": [1, "b c"]}
