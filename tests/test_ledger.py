"""The allocation ledger's parts: the PodResources answer read into holdings, the pods' UIDs from the
kubelet's checkpoint, device IDs located on their GPU, when the ledger reads (never on a timer while
nothing happens), the /allocations document and its text; and the kubelet stand-in that serves the
PodResources API from the pods admitted through it."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from nvdp.api.podresources import podresources_grpc, podresources_pb
from nvdp.base.errors import KubeletError, NvdpError, PodResourcesUnavailable
from nvdp.base.files import write_atomic
from nvdp.plugins.deviceplugin.status import AllocateNotice
from nvdp.plugins.ledger.checkpoint import CheckpointUids, parse_pod_uids, read_pod_uids, with_uids
from nvdp.plugins.ledger.document import Served, allocations_document
from nvdp.plugins.ledger.ledger import AFTER_ALLOCATE_S, AllocationLedger
from nvdp.plugins.ledger.locate import Located, locate
from nvdp.plugins.ledger.podresources import PodResourcesClient, holdings_of, pod_resources_socket
from nvdp.plugins.ledger.report import describe_allocations
from nvdp.plugins.ledger.types import Holding, LedgerSnapshot
from nvdp.sim.kubelet import Kubelet
from testkit import Process, start_plugin, wait_until
from tests.builders import full_gpu, mig_device_info, mig_enabled_gpu, replicas
from tests.readings import log_lines

GPU = "nvidia.com/gpu"


def list_answer(*pods: tuple[str, str, dict[str, list[tuple[str, list[str]]]]]) -> object:
    """A ListPodResourcesResponse: (namespace, name, {container: [(resource, ids), ...]}) per pod."""
    answer = podresources_pb.ListPodResourcesResponse()
    for namespace, name, containers in pods:
        pod = answer.pod_resources.add(namespace=namespace, name=name)
        for container, devices in containers.items():
            entry = pod.containers.add(name=container, cpu_ids=[3, 4])
            for resource, ids in devices:
                entry.devices.add(resource_name=resource, device_ids=ids)
    return answer


def test_holdings_of_a_list_answer_keep_nvidias_resources_once_each() -> None:
    answer = list_answer(
        ("ml", "train", {"main": [(GPU, ["GPU-0", "GPU-1"]), ("example.com/nic", ["eth1"])]}),
        ("ml", "train-init", {"init": [(GPU, ["GPU-2"])], "app": [(GPU, ["GPU-2"]), (GPU, ["GPU-2"])]}),
        ("web", "cpu-only", {"server": []}),
    )
    assert holdings_of(answer, "nvidia.com/") == [
        Holding(GPU, "GPU-0", "ml", "train", "main"),
        Holding(GPU, "GPU-1", "ml", "train", "main"),
        Holding(GPU, "GPU-2", "ml", "train-init", "init"),  # the kubelet hands init devices on to the app
        Holding(GPU, "GPU-2", "ml", "train-init", "app"),
    ]


@pytest.mark.parametrize(
    "device_ids",
    [
        pytest.param({"0": ["GPU-0::1"], "-1": ["GPU-1"]}, id="by-numa-node"),
        pytest.param(["GPU-0::1", "GPU-1"], id="list-before-1.20"),
    ],
)
def test_pod_uids_from_the_kubelets_checkpoint(device_ids: object) -> None:
    text = json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {"PodUID": "u-1", "ContainerName": "main", "ResourceName": GPU, "DeviceIDs": device_ids},
                    {"PodUID": 7, "ContainerName": "x", "ResourceName": GPU, "DeviceIDs": ["GPU-9"]},
                    "junk",
                ],
                "RegisteredDevices": {GPU: ["GPU-0::1", "GPU-1"]},
            },
            "Checksum": 1234,
        }
    )
    uids = parse_pod_uids(text)
    assert uids == {(GPU, "GPU-0::1", "main"): "u-1", (GPU, "GPU-1", "main"): "u-1"}
    held = [Holding(GPU, "GPU-1", "ml", "a", "main"), Holding(GPU, "GPU-1", "ml", "a", "other")]
    assert [h.uid for h in with_uids(held, uids)] == ["u-1", None]  # the container must match too


@pytest.mark.parametrize(
    ("content", "error"),
    [
        pytest.param(b"{}", "not a kubelet device checkpoint: no Data.PodDeviceEntries", id="no-entries"),
        pytest.param(b"\xff", "not a kubelet device checkpoint: 'utf-8' codec", id="not-text"),
        pytest.param(None, "No such file or directory", id="missing"),
    ],
)
def test_an_unreadable_checkpoint_is_one_line(tmp_path: Path, content: bytes | None, error: str) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(Exception) as raised:
        read_pod_uids(path)
    assert str(raised.value).startswith(f"{path}: ") and error in str(raised.value)
    assert "\n" not in str(raised.value)


def checkpoint_text(uid: str) -> bytes:
    entry = {"PodUID": uid, "ContainerName": "main", "ResourceName": GPU, "DeviceIDs": {"0": ["GPU-0"]}}
    return json.dumps({"Data": {"PodDeviceEntries": [entry]}, "Checksum": 0}).encode()


def test_the_checkpoint_is_parsed_again_only_when_the_kubelet_replaced_it(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    write_atomic(path, checkpoint_text("uid-1"))
    uids = CheckpointUids(path)
    first = uids.read()
    assert first == {(GPU, "GPU-0", "main"): "uid-1"}
    assert uids.read() is first  # unchanged: not read again
    write_atomic(path, checkpoint_text("uid-2"))  # the kubelet writes a new file and renames it
    assert uids.read() == {(GPU, "GPU-0", "main"): "uid-2"}
    path.unlink()
    with pytest.raises(NvdpError, match="No such file or directory"):
        uids.read()


def test_device_ids_are_located_on_their_gpu() -> None:
    gpu = full_gpu(3, uuid="GPU-c")
    mig_gpu = mig_enabled_gpu(1, "1g.5gb", "2g.10gb", uuid="GPU-m")
    mig = mig_gpu.mig_devices[1]
    served = {d.id: d for d in replicas(gpu, 2)}
    gpus = [gpu, mig_gpu]
    assert locate("GPU-c::1", served, gpus) == Located("GPU-c", "GPU-c", "3")  # a served replica
    assert locate("GPU-c::7", {}, gpus) == Located("GPU-c", "GPU-c", "3")  # a replica no longer served
    assert locate(mig.uuid, {}, gpus) == Located("GPU-m", mig.uuid, "1:1")
    assert locate("3", {}, gpus) == Located("GPU-c", "GPU-c", "3")  # index IDs
    assert locate("1:1::2", {}, gpus) == Located("GPU-m", mig.uuid, "1:1")
    assert locate("GPU-gone", {}, gpus) is None


def test_the_allocations_document() -> None:
    gpu = full_gpu(0, uuid="GPU-a")
    mig_gpu = mig_enabled_gpu(1, mig_device_info(0, "1g.5gb"), uuid="GPU-m")
    served = {
        GPU: Served({d.id: d for d in replicas(gpu, 2)}, {"GPU-a::0": True, "GPU-a::1": False}),
        "nvidia.com/mig-1g.5gb": Served({}, {}),
    }
    mig = mig_gpu.mig_devices[0]
    snapshot = LedgerSnapshot(
        "/k/pod-resources/kubelet.sock",
        (
            Holding(GPU, "GPU-a::1", "ml", "a", "main", "uid-a"),
            Holding(GPU, "GPU-a::1", "ml", "b", "main"),
            Holding("nvidia.com/mig-1g.5gb", mig.uuid, "ml", "c", "main", "uid-c"),  # no longer served
        ),
        read_at=1000.0,
    )
    document = allocations_document(
        snapshot, served, {"GPU-a": "XID 79: fell off the bus (fatal)"}, [gpu, mig_gpu], 1002.5
    )
    assert document == {
        "source": "/k/pod-resources/kubelet.sock",
        "readAt": "1970-01-01T00:16:40Z",
        "ageSeconds": 2.5,
        "problem": None,
        "resources": {
            GPU: [
                {"device": "GPU-a::0", "gpu": "GPU-a", "uuid": "GPU-a", "index": "0", "advertised": True,
                 "health": "Healthy", "pods": []},
                {"device": "GPU-a::1", "gpu": "GPU-a", "uuid": "GPU-a", "index": "0", "advertised": True,
                 "health": "Unhealthy", "reason": "XID 79: fell off the bus (fatal)",
                 "pods": [{"namespace": "ml", "name": "a", "uid": "uid-a", "container": "main"},
                          {"namespace": "ml", "name": "b", "uid": None, "container": "main"}]},
            ],
            "nvidia.com/mig-1g.5gb": [
                {"device": mig.uuid, "gpu": "GPU-m", "uuid": mig.uuid, "index": "1:0", "advertised": False,
                 "health": "Unknown",
                 "pods": [{"namespace": "ml", "name": "c", "uid": "uid-c", "container": "main"}]},
            ],
        },
    }  # fmt: skip
    assert describe_allocations(document).splitlines() == [
        "Allocations (kubelet PodResources at /k/pod-resources/kubelet.sock, read 2s ago)",
        "",
        f"{GPU}  2 devices: 1 held, 1 not healthy, 1 free",
        "  DEVICE                                          INDEX  HEALTH     HELD BY",
        "  GPU-a::1                                        0      Unhealthy  ml/a (main), ml/b (main)",
        "                                                         why: XID 79: fell off the bus (fatal)",
        "",
        "nvidia.com/mig-1g.5gb  1 device: 1 held, 1 not healthy, 0 free",
        "  DEVICE                                          INDEX  HEALTH     HELD BY",
        f"  {mig.uuid:<47} 1:0    Unknown    ml/c (main)",
    ]


@pytest.mark.parametrize(
    "document",
    [{}, {"resources": "x"}, {"resources": {GPU: [1, {"pods": "x"}]}, "ageSeconds": "y", "readAt": "z"}],
    ids=["empty", "bad-resources", "bad-devices"],
)
def test_the_text_of_a_document_from_elsewhere_is_no_traceback(document: dict[str, object]) -> None:
    assert describe_allocations(document).startswith("Allocations (kubelet PodResources")


class Reads:
    """A PodResources reader that records when (on `clock`) it reads and answers `holdings` (or fails
    with `problem`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.times: list[float] = []
        self.holdings: list[Holding] = []
        self.problem: str | None = None
        self.read = threading.Event()

    def __call__(self, prefix: str) -> list[Holding]:
        self.times.append(self.clock())
        self.read.set()
        if self.problem is not None:
            raise PodResourcesUnavailable(self.problem)
        return list(self.holdings)


AFTER = tuple(d / 10 for d in AFTER_ALLOCATE_S)  # the reads after an Allocate, sooner: 0.02 s, 0.1 s, 0.3 s


def test_the_ledger_reads_after_allocates_and_health_changes_not_on_a_timer(tmp_path: Path) -> None:
    """The ledger's clock is the test's: it stands still until moved to the next read's time, so each
    read is counted against what made it due, whatever the machine's load."""
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    socket.touch()  # present: the ledger reads once at start
    now = [0.0]
    reads = Reads(clock=lambda: now[0])
    ledger = AllocationLedger(socket, reader=reads, resync=3600, after_allocate=AFTER, clock=lambda: now[0])
    ledger.start()
    try:
        wait_until(lambda: len(reads.times) == 1, timeout=5, what="the read at start")
        reads.holdings = [Holding(GPU, "GPU-0", "ml", "a", "main")]
        for _ in range(5):  # a burst of Allocates shares its reads: one at each time after it
            ledger.allocated()
        for count, due in enumerate(AFTER, start=2):
            assert len(reads.times) == count - 1  # none before its time
            now[0] = due
            wait_until(lambda wanted=count: len(reads.times) == wanted, 10, f"the read at {due}s")
        assert reads.times == [0.0, *AFTER]
        assert ledger.held(GPU, ["GPU-0", "GPU-1"]) == reads.holdings
        now[0] = 1.0
        ledger.changed()  # a health change: one read, at once
        wait_until(lambda: len(reads.times) == 5, timeout=5, what="the read after a health change")
        ledger.fresh(60.0)  # read 0 s ago: from memory
        assert len(reads.times) == 5
        now[0] = 2.0
        ledger.fresh(1.0)  # read 1 s ago: from memory
        assert len(reads.times) == 5
        ledger.fresh(0.5)
        assert len(reads.times) == 6
    finally:
        ledger.stop()
    assert reads.times == [0.0, *AFTER, 1.0, 2.0]  # and none on a timer


def test_a_kubelet_that_stops_answering_keeps_the_last_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reads = Reads()
    reads.holdings = [Holding(GPU, "GPU-0", "ml", "a", "main")]
    ledger = AllocationLedger(tmp_path / "kubelet.sock", reader=reads)
    caplog.set_level(logging.INFO, logger="nvdp.plugins.ledger")
    first = ledger.fresh(0.0)
    reads.problem = "PodResources List on x failed: UNAVAILABLE: gone"
    for _ in range(3):
        stale = ledger.fresh(0.0)
    assert stale.holdings == first.holdings and stale.read_at == first.read_at
    assert stale.problem == "PodResources List on x failed: UNAVAILABLE: gone"
    reads.problem = None
    assert ledger.fresh(0.0).problem is None
    assert [line.split(" socket=")[0].split(" error=")[0] for line in log_lines(caplog)] == [
        "reading pod allocations from the kubelet",
        "PodResources API not answering; keeping the allocations read last",  # once, not per read
        "reading pod allocations from the kubelet",
    ]


def test_allocate_notice_tells_the_ledger_of_allocates_answered() -> None:
    seen: list[str] = []
    counted: list[tuple[str, str, grpc.StatusCode]] = []

    class Observer:
        def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
            counted.append((resource, method, code))

    notice = AllocateNotice(lambda: seen.append("allocated"), Observer())
    notice.rpc_done(GPU, "GetPreferredAllocation", grpc.StatusCode.OK, 0.001)
    notice.rpc_done(GPU, "Allocate", grpc.StatusCode.INVALID_ARGUMENT, 0.001)
    notice.rpc_done(GPU, "Allocate", grpc.StatusCode.OK, 0.001)
    assert seen == ["allocated"]
    assert len(counted) == 3  # the metrics still count every call


# ---- the kubelet stand-in's side ----------------------------------------------------------------


@pytest.fixture
def served(sock_dir: Path, processes: list[Process]) -> Iterator[Kubelet]:
    kubelet = Kubelet(sock_dir / "device-plugins", pod_resources=True)
    kubelet.start()
    processes.append(start_plugin(sock_dir / "device-plugins", "sim:pcie-4"))
    kubelet.wait_for_devices(GPU, timeout=20)
    yield kubelet
    kubelet.stop()


def test_the_stand_in_serves_pod_resources_and_writes_the_checkpoint(served: Kubelet) -> None:
    kubelet = served
    assert kubelet.pod_resources_socket == pod_resources_socket(kubelet.socket_path)
    pod = kubelet.admit_pod("ml", "train", {"main": {GPU: 2}, "aux": {GPU: 1}}, uid="uid-1")
    assert [(a.container, len(a.device_ids)) for a in pod.assignments] == [("main", 2), ("aux", 1)]
    assert len({i for a in pod.assignments for i in a.device_ids}) == 3
    assert pod.assignments[0].response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(
        pod.assignments[0].device_ids
    )
    with grpc.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as channel:
        stub = podresources_grpc.PodResourcesListerStub(channel)
        listed = stub.List(podresources_pb.ListPodResourcesRequest(), timeout=5)
        one = stub.Get(
            podresources_pb.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=5
        )
        allocatable = stub.GetAllocatableResources(podresources_pb.AllocatableResourcesRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(podresources_pb.GetPodResourcesRequest(pod_name="x", pod_namespace="ml"), timeout=5)
    assert listed.pod_resources == [one.pod_resources]
    main = one.pod_resources.containers[0]
    assert [(d.resource_name, list(d.device_ids)) for d in main.devices] == [
        (GPU, [i])
        for i in pod.assignments[0].device_ids  # one ContainerDevices per device, as the kubelet
    ]
    assert [n.ID for n in main.devices[0].topology.nodes] == [0]
    assert sorted(i for d in allocatable.devices for i in d.device_ids) == sorted(kubelet.devices(GPU))
    assert missing.value.code() == grpc.StatusCode.UNKNOWN
    assert missing.value.details() == "pod x not found in namespace ml"
    client = PodResourcesClient(kubelet.pod_resources_socket)
    try:
        held = client.list("nvidia.com/")
    finally:
        client.close()
    assert with_uids(held, read_pod_uids(kubelet.plugin_dir / "kubelet_internal_checkpoint")) == [
        Holding(GPU, i, "ml", "train", a.container, "uid-1") for a in pod.assignments for i in a.device_ids
    ]
    kubelet.remove_pod("ml", "train")
    assert parse_pod_uids((kubelet.plugin_dir / "kubelet_internal_checkpoint").read_text()) == {}


def test_the_stand_in_refuses_a_pod_it_cannot_give_devices(served: Kubelet) -> None:
    served.admit_pod("ml", "big", {"main": {GPU: 3}})
    with pytest.raises(KubeletError) as refused:
        served.admit_pod("ml", "too-big", {"main": {GPU: 1}, "second": {GPU: 1}})
    assert str(refused.value) == f"pod ml/too-big refused: container second asks for 1 {GPU}, 0 free"
    assert [p.name for p in served.pods.pods()] == ["big"]  # nothing recorded of the refused pod
    with pytest.raises(KubeletError, match="already admitted"):
        served.admit_pod("ml", "big", {"main": {GPU: 1}})


def test_a_missing_socket_is_one_line(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "pod-resources" / "kubelet.sock")
    with pytest.raises(PodResourcesUnavailable) as raised:
        client.list("nvidia.com/")
    assert str(raised.value) == f"no PodResources socket at {tmp_path}/pod-resources/kubelet.sock"
