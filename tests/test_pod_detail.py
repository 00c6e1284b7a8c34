"""Who is told which pod holds which device (--pod-detail / POD_DETAIL, the chart's
metrics.podDetail): by default clients on the loopback only (`nvdp status` in the plugin's container);
any other client gets /allocations with how many containers hold each device, and
nvdp_device_allocated without its namespace, pod and container labels. `all` tells every client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.http_endpoint import is_loopback
from nvdp.node.gpus.devices import Device
from nvdp.node.gpus.resources import Resource
from nvdp.plugins.ledger.document import Served, allocations_document
from nvdp.plugins.ledger.report import describe_allocations
from nvdp.plugins.ledger.types import Holding, LedgerSnapshot
from nvdp.plugins.metrics import AllocationPages, Metrics
from nvdp.sim.kubelet import Kubelet
from testkit import REPO, Process, clean_env, free_port, start_plugin, wait_until
from tests import test_deploy
from tests.builders import full_gpu, replicas, resource
from tests.test_config_options import errors, run
from tests.test_deploy import Rendered, env_of

# test_deploy's Helm fixtures, shared by name.
renderer, render, render_error = test_deploy.renderer, test_deploy.render, test_deploy.render_error

GPU = "nvidia.com/gpu"
WITHHELD_LINE = "  pods withheld: the plugin names them to clients on its loopback only (--pod-detail)"


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # an IPv4 client of a dual-stack socket
        ("192.0.2.2", False),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fd00::2", False),
        ("fe80::1%eth0", False),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("not-an-address", False),
    ],
    ids=lambda value: str(value) or "empty",
)
def test_which_peers_are_on_the_loopback(peer: str, local: bool) -> None:
    assert is_loopback(peer) is local


# ---- the decision, with the client's address given -------------------------------------------------


class _Server:
    def __init__(self, served: Resource) -> None:
        self.resource = served
        self.socket_path = Path("/dp/gpu.sock")
        self.open_streams = 1

    def health(self) -> Mapping[str, bool]:
        return dict.fromkeys(self.resource.devices, True)

    def socket_is_ours(self) -> bool:
        return True


class _Supervisor:
    started = True

    def __init__(self, served: Resource) -> None:
        self.servers = {served.name: _Server(served)}

    def registrations(self) -> Mapping[str, bool]:
        return dict.fromkeys(self.servers, True)


class _Ledger:
    def __init__(self, snapshot: LedgerSnapshot) -> None:
        self.snapshot = snapshot

    def recent(self, max_age: float) -> LedgerSnapshot:
        return self.snapshot


def _metrics(pod_detail: str) -> Metrics:
    """Metrics over one GPU in two replicas; replica 0 held by two containers of pod ml/train-0."""
    gpu = full_gpu(0, uuid="GPU-a")
    held = [Holding(GPU, "GPU-a::0", "ml", "train-0", c, "uid-t") for c in ("main", "sidecar")]
    snapshot = LedgerSnapshot("/k/pod-resources/kubelet.sock", tuple(held), read_at=1000.0)
    served = resource(GPU, replicas(gpu, 2))
    pages = AllocationPages(_Ledger(snapshot), _Supervisor(served), None, lambda: [gpu], pod_detail)
    return Metrics(":0", allocations=pages)


def _page(metrics: Metrics, peer: str) -> dict[str, Any]:
    page = metrics.extra_page("/allocations", peer)
    assert page is not None and page[0] == "application/json"
    document: dict[str, Any] = json.loads(page[1])
    return document


def _allocated(exposition: bytes) -> list[str]:
    return [line for line in exposition.decode().splitlines() if line.startswith("nvdp_device_allocated")]


NAMED = [
    {"namespace": "ml", "name": "train-0", "uid": "uid-t", "container": "main"},
    {"namespace": "ml", "name": "train-0", "uid": "uid-t", "container": "sidecar"},
]
LABELS = 'resource="nvidia.com/gpu",device="GPU-a::0",gpu_uuid="GPU-a"'


@pytest.mark.parametrize(
    ("pod_detail", "peer", "shown"),
    [
        ("local", "127.0.0.1", True),
        ("local", "127.0.0.2", True),
        ("local", "::1", True),
        ("local", "::ffff:127.0.0.1", True),
        ("local", "10.1.2.3", False),
        ("local", "::ffff:10.1.2.3", False),
        ("local", "fd00::2", False),
        ("all", "10.1.2.3", True),
        ("all", "127.0.0.1", True),
    ],
    ids=lambda value: str(value),
)
def test_pods_are_told_to_the_clients_pod_detail_allows(pod_detail: str, peer: str, shown: bool) -> None:
    metrics = _metrics(pod_detail)
    document = _page(metrics, peer)
    held, free = document["resources"][GPU]
    samples = _allocated(metrics.render_metrics(peer))
    if shown:
        assert "podDetail" not in document
        assert (held["pods"], free["pods"]) == (NAMED, [])
        assert "holders" not in held
        assert samples == [
            f'nvdp_device_allocated{{{LABELS},namespace="ml",pod="train-0",container="{c}"}} 1'
            for c in ("main", "sidecar")
        ]
    else:
        assert document["podDetail"] == "withheld"
        assert (held["holders"], free["holders"]) == (2, 0)
        assert "pods" not in held and "pods" not in free
        assert "train-0" not in json.dumps(document) and "uid-t" not in json.dumps(document)
        assert samples == [f"nvdp_device_allocated{{{LABELS}}} 1"]  # one per device held


def test_a_withheld_document_counts_the_holders_in_text() -> None:
    gpu = full_gpu(0, uuid="GPU-a")
    devices: dict[str, Device] = {d.id: d for d in replicas(gpu, 3)}
    snapshot = LedgerSnapshot(
        "/k/pod-resources/kubelet.sock",
        (
            Holding(GPU, "GPU-a::0", "ml", "a", "main", "uid-a"),
            Holding(GPU, "GPU-a::0", "ml", "a", "side", "uid-a"),
            Holding(GPU, "GPU-a::1", "web", "b", "main"),
        ),
        read_at=1000.0,
    )
    served = {GPU: Served(devices, dict.fromkeys(devices, True))}
    document = allocations_document(snapshot, served, {}, [gpu], 1001.0, pods=False)
    assert document["podDetail"] == "withheld"
    assert [(d["device"], d["holders"]) for d in document["resources"][GPU]] == [
        ("GPU-a::0", 2),
        ("GPU-a::1", 1),
        ("GPU-a::2", 0),
    ]
    assert describe_allocations(document).splitlines() == [
        "Allocations (kubelet PodResources at /k/pod-resources/kubelet.sock, read 1s ago)",
        WITHHELD_LINE,
        "",
        f"{GPU}  3 devices: 2 held, 0 not healthy, 1 free",
        "  DEVICE                                          INDEX  HEALTH     HELD BY",
        "  GPU-a::0                                        0      Healthy    2 containers (pods withheld)",
        "  GPU-a::1                                        0      Healthy    1 container (pods withheld)",
    ]


# ---- the setting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, "local"),
        (["--pod-detail=all"], {}, "all"),
        ([], {"POD_DETAIL": "all"}, "all"),
        ([], {"POD_DETAIL": ""}, "local"),  # empty: unset
        (["--pod-detail", "local"], {"POD_DETAIL": "all"}, "local"),  # the flag wins
    ],
    ids=["default", "flag", "env", "empty-env", "flag-over-env"],
)
def test_the_setting_comes_from_the_flag_or_env(argv: list[str], env: dict[str, str], expected: str) -> None:
    options = run(argv, env)
    assert options.runtime.pod_detail == expected
    assert json.loads(options.to_json())["podDetail"] == expected


@pytest.mark.parametrize(
    ("argv", "env", "value"),
    [(["--pod-detail=none"], {}, "none"), ([], {"POD_DETAIL": "Local"}, "Local")],
    ids=["flag", "env"],
)
def test_a_bad_setting_is_one_line(argv: list[str], env: dict[str, str], value: str) -> None:
    assert errors(argv, env) == [f'--pod-detail / POD_DETAIL: invalid value "{value}" (accepted: local, all)']


@pytest.mark.parametrize(
    ("values", "expected"),
    [({}, None), ({"metrics": {"podDetail": "local"}}, "local"), ({"metrics": {"podDetail": "all"}}, "all")],
    ids=["default-unset", "local", "all"],
)
def test_the_chart_passes_metrics_pod_detail(
    render: Callable[..., Rendered], values: dict[str, Any], expected: str | None
) -> None:
    assert env_of(render(values).daemonset).get("POD_DETAIL") == expected


def test_the_chart_refuses_a_bad_pod_detail(render_error: Callable[..., str]) -> None:
    said = render_error({"metrics": {"podDetail": "everyone"}})
    assert 'metrics.podDetail: invalid value "everyone" (accepted: local, all)' in said


# ---- a real plugin process ------------------------------------------------------------------------


def _outward_address(family: socket.AddressFamily, probe: str) -> str | None:
    """This host's address towards `probe` (a documentation address): one that is not loopback;
    None where the host has no route there."""
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect((probe, 9))
        except OSError:
            return None
        address: str = udp.getsockname()[0]
        return None if is_loopback(address) else address


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


IPV4 = _outward_address(socket.AF_INET, "192.0.2.1")
IPV6 = _outward_address(socket.AF_INET6, "2001:db8::1")
NO_IPV6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 on this host")


def _get_from(source: str, target: str, port: int, path: str) -> tuple[int, str]:
    """GET `path` from `target`:`port` over a connection from `source` (the peer the plugin sees)."""
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.bind((source, 0))
        client.connect((target, port))
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: nvdp\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


class ServingNode:
    """A kubelet stand-in with PodResources and a plugin listening on `address` (port `port`), with pod
    ml/train-0 holding one GPU."""

    def __init__(self, kubelet: Kubelet, plugin: Process, port: int, device_id: str) -> None:
        self.kubelet, self.plugin, self.port, self.device_id = kubelet, plugin, port, device_id

    def allocations(self, source: str, target: str) -> dict[str, Any]:
        status, body = _get_from(source, target, self.port, "/allocations")
        assert status == 200, body
        document: dict[str, Any] = json.loads(body)
        return document

    def held(self, source: str, target: str) -> dict[str, Any]:
        """The entry of the device the pod holds, as `source` is told."""
        devices = self.allocations(source, target)["resources"][GPU]
        return next(d for d in devices if d["device"] == self.device_id)

    def allocated(self, source: str, target: str) -> list[str]:
        status, body = _get_from(source, target, self.port, "/metrics")
        assert status == 200
        return [line for line in body.splitlines() if line.startswith("nvdp_device_allocated{")]


@pytest.fixture
def node(sock_dir: Path, tmp_path: Path, processes: list[Process]) -> Iterator[Callable[..., ServingNode]]:
    kubelets: list[Kubelet] = []

    def start(listen: str, env: Mapping[str, str] | None = None) -> ServingNode:
        plugin_dir = sock_dir / "device-plugins"
        kubelet = Kubelet(plugin_dir, pod_resources=True)
        kubelet.start()
        kubelets.append(kubelet)
        port = free_port()
        plugin = start_plugin(
            plugin_dir, metrics_address=f"{listen}:{port}", env=env, log_path=tmp_path / "plugin.log"
        )
        processes.append(plugin)
        kubelet.wait_for_devices(GPU, timeout=20)
        pod = kubelet.admit_pod("ml", "train-0", {"main": {GPU: 1}}, uid="uid-train")
        started = ServingNode(kubelet, plugin, port, pod.assignments[0].device_ids[0])
        wait_until(
            lambda: started.held("127.0.0.1", "127.0.0.1").get("pods"), timeout=10, what="the pod held"
        )
        return started

    yield start
    for kubelet in kubelets:
        kubelet.stop()


POD = [{"namespace": "ml", "name": "train-0", "uid": "uid-train", "container": "main"}]


def _pod_sample(device_id: str) -> str:
    return (
        f'nvdp_device_allocated{{resource="{GPU}",device="{device_id}",gpu_uuid="{device_id}",'
        'namespace="ml",pod="train-0",container="main"} 1'
    )


def _count_sample(device_id: str) -> str:
    return f'nvdp_device_allocated{{resource="{GPU}",device="{device_id}",gpu_uuid="{device_id}"}} 1'


# (source, target) of each client; None where this host has no such address.
LOOPBACK_V4 = [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.1")]
REMOTE_V4 = [(IPV4, IPV4)] if IPV4 else []


@pytest.mark.parametrize(
    ("listen", "local", "remote"),
    [
        (
            "",  # the chart's ":2112": every IPv4 interface
            LOOPBACK_V4,
            REMOTE_V4,
        ),
        pytest.param(
            "[::]",  # dual stack: IPv4 clients as ::ffff:a.b.c.d
            [*LOOPBACK_V4, ("::1", "::1")],
            [*REMOTE_V4, *([(IPV6, IPV6)] if IPV6 else [])],
            marks=NO_IPV6,
        ),
    ],
    ids=["ipv4-every-interface", "dual-stack"],
)
def test_the_plugin_names_pods_to_loopback_clients_only(
    node: Callable[..., ServingNode], listen: str, local: list[tuple[str, str]], remote: list[tuple[str, str]]
) -> None:
    plugin = node(listen)
    device_id = plugin.device_id
    for source, target in local:
        assert plugin.held(source, target)["pods"] == POD, source
        assert plugin.allocated(source, target) == [_pod_sample(device_id)], source
    if not remote:
        pytest.skip("this host has no address but loopback: remote clients checked with given peers only")
    for source, target in remote:
        document = plugin.allocations(source, target)
        assert document["podDetail"] == "withheld", source
        assert "train-0" not in json.dumps(document) and "uid-train" not in json.dumps(document), source
        held = next(d for d in document["resources"][GPU] if d["device"] == device_id)
        assert held["holders"] == 1 and "pods" not in held, source
        assert plugin.allocated(source, target) == [_count_sample(device_id)], source


@pytest.mark.skipif(IPV4 is None, reason="this host has no IPv4 address but loopback")
def test_pod_detail_all_names_pods_to_remote_clients(node: Callable[..., ServingNode]) -> None:
    assert IPV4 is not None
    plugin = node("", env={"POD_DETAIL": "all"})
    assert plugin.held(IPV4, IPV4)["pods"] == POD
    assert plugin.allocated(IPV4, IPV4) == [_pod_sample(plugin.device_id)]


@pytest.mark.skipif(IPV4 is None, reason="this host has no IPv4 address but loopback")
def test_status_from_a_remote_address_counts_the_holders(node: Callable[..., ServingNode]) -> None:
    assert IPV4 is not None
    plugin = node("")
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "status", "--metrics-address", f"{IPV4}:{plugin.port}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == WITHHELD_LINE
    assert f"{GPU}  8 devices: 1 held, 0 not healthy, 7 free" in lines
    (row,) = [line for line in lines if line.startswith(f"  {plugin.device_id}")]
    assert row.split()[2:] == ["Healthy", "1", "container", "(pods", "withheld)"]
