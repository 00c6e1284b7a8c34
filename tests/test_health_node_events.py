"""Node events through nvdp.kube (wired by nvdp.plugins.deviceplugin.daemon) against a local stub API server;
API trouble
never blocks health."""

from __future__ import annotations

import datetime
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nvdp.kube import KubeEvents
from nvdp.node.health import HealthChange, HealthRouter
from nvdp.node.health.node_events import NodeEventRecorder, node_events_from_env
from tests.builders import full_gpu, replicas
from tests.fakes import FakeTarget

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
NODE = "gpu-node-1"


@dataclass
class StubApi:
    """A few lines of API server: records requests, answers with `status` after `delay`."""

    status: int = 201
    delay: float = 0.0
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def api() -> Iterator[StubApi]:
    stub = StubApi()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stub.requests.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            time.sleep(stub.delay)
            answer = json.dumps(
                body if stub.status < 300 else {"kind": "Status", "code": stub.status}
            ).encode()
            self.send_response(stub.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield stub
    server.shutdown()
    server.server_close()


def recorder_for(url: str, max_queue: int = 64) -> NodeEventRecorder:
    return NodeEventRecorder(
        lambda: KubeEvents(NODE, host=url, token="secret"), node=NODE, max_queue=max_queue
    )


def test_transitions_become_node_events(api: StubApi) -> None:
    events = recorder_for(api.url)
    target = FakeTarget("nvidia.com/gpu", replicas(full_gpu(3, uuid=GPU), 2))
    router = HealthRouter([target], node_events=events)
    router.handle([HealthChange(GPU, False, "GPU has fallen off the bus", 79, True, 1.0)])
    router.handle([HealthChange(GPU, True, "recovered", None, False, 61.0)])
    assert events.join(10)
    assert [r[1] for r in api.requests] == ["/api/v1/namespaces/default/events"] * 2
    assert api.requests[0][2]["authorization"] == "Bearer secret"
    first, second = api.requests[0][3], api.requests[1][3]
    assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    assert first["type"] == "Warning"
    assert first["reason"] == "GPUUnhealthy"
    assert first["message"] == (
        f"device unhealthy resource=nvidia.com/gpu device={GPU} index=3 xid=79 "
        f'reason="GPU has fallen off the bus" fatal=true'
    )
    assert first["source"] == {"component": "nvidia-device-plugin", "host": NODE}
    assert first["metadata"]["namespace"] == "default"
    assert first["metadata"]["name"].startswith(f"{NODE}.")
    assert first["count"] == 1
    assert datetime.datetime.fromisoformat(first["firstTimestamp"]).utcoffset() == datetime.timedelta(0)
    assert (second["type"], second["reason"]) == ("Normal", "GPUHealthy")
    assert second["message"] == f"device healthy resource=nvidia.com/gpu device={GPU} index=3 after=1m0s"
    assert events.sent == 2


@pytest.mark.parametrize("failure", ["http-500", "connection-refused"])
def test_api_failure_does_not_stop_health(
    api: StubApi, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    if failure == "http-500":
        api.status, url = 500, api.url
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens
    events = recorder_for(url)
    target = FakeTarget("nvidia.com/gpu", replicas(full_gpu(3, uuid=GPU), 2))
    router = HealthRouter([target], node_events=events)
    caplog.set_level(logging.WARNING, logger="nvdp.node.health.node_events")
    router.handle([HealthChange(GPU, False, "GPU has fallen off the bus", 79, True, 1.0)])
    router.handle([HealthChange(GPU, True, "recovered", None, False, 2.0)])
    assert target.calls == [([f"{GPU}::0", f"{GPU}::1"], False), ([f"{GPU}::0", f"{GPU}::1"], True)]
    assert events.join(20)
    assert events.failed == 2 and events.sent == 0
    lines = [r for r in caplog.records if r.getMessage() == "node event not recorded"]
    assert len(lines) == 2
    assert all("\n" not in str(r.__dict__["nvdp_fields"]["error"]) for r in lines)


def test_slow_api_never_blocks_and_full_queue_drops(api: StubApi, caplog: pytest.LogCaptureFixture) -> None:
    api.delay = 3.0  # a synchronous post would make each handle() take 3 s
    events = recorder_for(api.url, max_queue=1)
    target = FakeTarget("nvidia.com/gpu", replicas(full_gpu(3, uuid=GPU), 2))
    router = HealthRouter([target], node_events=events)
    caplog.set_level(logging.WARNING, logger="nvdp.node.health.node_events")
    started = time.monotonic()
    for n in range(6):
        router.handle([HealthChange(GPU, n % 2 == 1, "x", None, False, float(n))])
    assert time.monotonic() - started < 2.0
    assert len(target.calls) == 6
    assert events.dropped >= 1
    assert any(r.getMessage() == "node event dropped: queue full" for r in caplog.records)
    events.close(timeout=0.1)


def test_from_env(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert node_events_from_env({}, token_file=str(token)) is None
    env = {"NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert node_events_from_env(env, token_file=str(token)) is None  # no token
    token.write_text("t")
    assert node_events_from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, token_file=str(token)) is None
    recorder = node_events_from_env(env, token_file=str(token))
    assert isinstance(recorder, NodeEventRecorder)
    recorder.close()


def test_kubernetes_is_not_imported_by_default() -> None:
    code = (
        "import sys, nvdp.node.health, nvdp.node.health.monitor, nvdp.node.health.router, nvdp.kube;"
        "sys.exit(1 if 'kubernetes' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode == 0


def test_the_plugin_imports_the_api_transport_only_when_an_event_is_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    code = f"""
import sys
from nvdp.base.ssl_block import block_ssl
block_ssl()
from nvdp.node.health.node_events import node_events_from_env
env = {{"NODE_NAME": "n", "KUBERNETES_SERVICE_HOST": "127.0.0.1"}}
events = node_events_from_env(env, token_file={str(token)!r})
before = "urllib3" in sys.modules
events.record("Warning", "GPUUnhealthy", "device unhealthy")
assert events.join(60)
print(before, "urllib3" in sys.modules, events.sent + events.failed)
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "1"]
