"""/metrics, /healthz and /readyz of a real daemon (simulated dgx-a100, kubelet stand-in, real sockets).

The daemon runs in-process on a thread with metrics on 127.0.0.1:0. Every wait polls a condition with
a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest

from nvdp.config import Config, resolve
from nvdp.daemon import Daemon
from nvdp.errors import ConfigError, NvdpError
from nvdp.health import xid_reason
from nvdp.kubelet import Kubelet
from nvdp.logs import JsonFormatter, TextFormatter, log_event
from nvdp.metrics import Metrics, parse_address
from nvdp.nvml import nvml_error
from tests.plugin_process import REPO, wait_until

GPU = "nvidia.com/gpu"
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


# ---- helpers ------------------------------------------------------------------------------------


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name, labels, value = match.groups()
            samples.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return samples


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample `name` whose labels include `labels`; None when there is none."""
    found = [v for n, ls, v in parse_metrics(text) if n == name and labels.items() <= ls.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def sim_daemon(
    sock_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    reload_config: Callable[[], Config] | None = None,
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
        wait_until(lambda: self.metrics.port or self.error, what="metrics port")
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
        url = f"http://127.0.0.1:{self.metrics.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

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


def inject(events: Path, **line: object) -> None:
    with events.open("a") as f:
        f.write(json.dumps(line) + "\n")


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


class _BrokenNvml:
    """NVML that cannot initialize (no driver on this node)."""

    def init(self) -> None:
        raise nvml_error("NVML_ERROR_LIBRARY_NOT_FOUND", "nvmlInit_v2")


def test_idling_without_nvml_is_ready(sock_dir: Path) -> None:
    """fail-on-init-error=false: the plugin idles on purpose; a DaemonSet rollout must not wait on it."""
    plugin = Plugin(sim_daemon(sock_dir, nvml=_BrokenNvml(), fail_on_init_error="false")).start()
    try:
        assert plugin.get("/readyz") == (200, "ok\n")
        text = plugin.get("/metrics")[1]
        assert value(text, "nvdp_nvml_errors_total", call="nvmlInit_v2") == 1
        assert value(text, "nvdp_devices") is None
    finally:
        plugin.stop()


class _FakeServer:
    def __init__(self, path: str) -> None:
        self.socket_path = Path(path)
        self.serving = True

    def socket_is_ours(self) -> bool:
        return self.serving


def test_healthz_fails_when_a_registered_socket_stays_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics("127.0.0.1:0")
    server = _FakeServer("/dp/nvidia-gpu.sock")
    metrics.servers_changed({GPU: server})  # type: ignore[dict-item]
    metrics.registered(GPU, True)
    assert metrics.liveness_problem() is None
    server.serving = False
    assert metrics.liveness_problem() is None  # within the grace period: being restarted
    monkeypatch.setattr("nvdp.metrics.SOCKET_GRACE_S", 0.0)
    assert metrics.liveness_problem() == "plugin socket missing for over 0s: /dp/nvidia-gpu.sock"
    metrics.kubelet_lost()  # the kubelet went away: the supervisor restarts the server when it is back
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

    text = plugin.wait_metric("nvdp_grpc_request_duration_seconds_count", 7, resource=GPU, method="Allocate")
    requests = "nvdp_grpc_requests_total"
    assert value(text, requests, resource=GPU, method="Allocate", code="OK") == 5
    assert value(text, requests, resource=GPU, method="Allocate", code="INVALID_ARGUMENT") == 2
    assert value(text, requests, resource=GPU, method="GetPreferredAllocation", code="OK") == 1
    assert (
        value(text, "nvdp_grpc_request_duration_seconds_bucket", resource=GPU, method="Allocate", le="+Inf")
        == 7
    )
    seconds = value(text, "nvdp_grpc_request_duration_seconds_sum", resource=GPU, method="Allocate")
    assert seconds is not None and 0 < seconds < 7
    assert value(text, "nvdp_devices", resource=GPU, sharing="none") == 8
    assert value(text, "nvdp_listandwatch_streams", resource=GPU) == 1
    assert value(text, "nvdp_build_info", version="0.1.0") == 1
    assert value(text, "nvdp_health_monitor_degraded") == 0
    assert value(text, "nvdp_config_reloads_total", result="success") == 0
    assert [v for n, _, v in parse_metrics(text) if n == "nvdp_device_healthy"] == [1.0] * 8
    names = {n for n, _, _ in parse_metrics(text)}
    assert not any(n.endswith("_created") for n in names)


def test_xid_and_nvml_errors_show_up(plugin: Plugin, kubelet: Kubelet, events: Path) -> None:
    kubelet.start()
    registered(plugin, kubelet)
    uuid = sorted(kubelet.devices(GPU))[3]
    inject(events, uuid=uuid, xid=79)
    text = plugin.wait_metric("nvdp_device_healthy", 0, resource=GPU, device=uuid, reason=xid_reason(79))
    assert value(text, "nvdp_health_events_total", xid="79") == 1
    healthy = {ls["device"]: v for n, ls, v in parse_metrics(text) if n == "nvdp_device_healthy"}
    assert healthy == {i: float(i != uuid) for i in kubelet.devices(GPU)}

    inject(events, event="wait-error", code="NVML_ERROR_UNKNOWN")  # a failed nvmlEventSetWait
    plugin.wait_metric("nvdp_nvml_errors_total", 1, call="nvmlEventSetWait_v2")
    assert plugin.wait_metric("nvdp_health_monitor_degraded", 0)  # re-armed after the failed wait


def test_reloads_are_counted_by_result(sock_dir: Path, events: Path, kubelet: Kubelet) -> None:
    outcomes = iter([True, False])
    args = argparse.Namespace(nvml="sim:dgx-a100", kubelet_socket=str(sock_dir / "kubelet.sock"))

    def reload_config() -> Config:
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


def test_metrics_off_binds_nothing_and_never_imports_prometheus_client(sock_dir: Path) -> None:
    assert sim_daemon(sock_dir, metrics_address="").metrics is None
    code = (
        "import sys, nvdp.cli, nvdp.daemon; "
        "sys.exit('prometheus_client' in sys.modules or 'nvdp.metrics' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


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
    ours = [r for r in caplog.records if r.name.startswith("nvdp.") and not r.name.startswith("nvdp.kubelet")]
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
