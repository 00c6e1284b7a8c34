"""The ledger cannot be starved or grown: a PodResources server that hangs costs a page nothing
(the last read is served and the next one happens in the background), and an answer is bounded in
bytes and in devices (a larger one is one line, and the last read is kept)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api.podresources import podresources_grpc, podresources_pb
from nvdp.base.errors import PodResourcesUnavailable
from nvdp.plugins.ledger.ledger import PAGE_WAIT_S, AllocationLedger
from nvdp.plugins.ledger.podresources import MAX_ANSWER_BYTES, PodResourcesClient, holdings_of
from nvdp.plugins.ledger.types import Holding
from testkit import wait_until

GPU = "nvidia.com/gpu"


class HangingReads:
    """Answers `holdings` at once until `hang` is set; then each read blocks until `release` is."""

    def __init__(self) -> None:
        self.holdings = [Holding(GPU, "GPU-0", "ml", "a", "main")]
        self.hang = threading.Event()
        self.release = threading.Event()
        self.count = 0

    def __call__(self, prefix: str) -> list[Holding]:
        self.count += 1
        if self.hang.is_set():
            self.release.wait(30)
        return list(self.holdings)


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[AllocationLedger, HangingReads]]:
    """A started ledger whose PodResources socket is there, reading through HangingReads."""
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    reads = HangingReads()
    ledger = AllocationLedger(socket, reader=reads, resync=3600)
    ledger.start()
    try:
        yield ledger, reads
    finally:
        reads.release.set()
        ledger.stop()


def test_a_hanging_kubelet_costs_a_page_nothing(started: tuple[AllocationLedger, HangingReads]) -> None:
    ledger, reads = started
    wait_until(lambda: ledger.snapshot().read_at is not None, 5, "the read at start")
    first = ledger.snapshot()
    reads.hang.set()
    page, took = timed(lambda: ledger.recent(0.0))  # asks a read, which hangs: waits PAGE_WAIT_S
    assert page.holdings == first.holdings and took < PAGE_WAIT_S + 1.0
    for _ in range(5):  # while the read hangs, pages are answered from memory at once
        page, took = timed(lambda: ledger.recent(0.0))
        assert page.read_at == first.read_at and took < 0.1
    reads.holdings = [Holding(GPU, "GPU-1", "ml", "b", "main")]
    reads.hang.clear()
    reads.release.set()
    wait_until(lambda: ledger.recent(0.0).holdings == tuple(reads.holdings), 5, "the kubelet answers again")


def test_a_page_gets_a_fresh_read_from_a_kubelet_that_answers(
    started: tuple[AllocationLedger, HangingReads],
) -> None:
    ledger, reads = started
    wait_until(lambda: reads.count == 1, 5, "the read at start")
    reads.holdings = [Holding(GPU, "GPU-3", "ml", "c", "main")]
    assert ledger.recent(0.0).holdings == tuple(reads.holdings)
    count = reads.count
    ledger.recent(60.0)  # read a moment ago: from memory
    assert reads.count == count


def answer_with(pods: int, holdings_each: int = 1) -> Any:
    answer = podresources_pb.ListPodResourcesResponse()
    for n in range(pods):
        pod = answer.pod_resources.add(namespace="tenant", name=f"pod-{n}")
        ids = [f"GPU-{n}-{k}" for k in range(holdings_each)]
        pod.containers.add(name="main").devices.add(resource_name=GPU, device_ids=ids)
    return answer


def test_an_answer_naming_too_many_devices_is_one_line() -> None:
    assert len(holdings_of(answer_with(10), "nvidia.com/", limit=10)) == 10
    with pytest.raises(PodResourcesUnavailable) as refused:
        holdings_of(answer_with(11), "nvidia.com/", limit=10)
    assert str(refused.value) == "PodResources answer names more than 10 devices of nvidia.com/*; not read"


class _Lister(podresources_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.answer


def test_an_answer_over_the_byte_bound_is_refused(sock_dir: Path) -> None:
    big = answer_with(1, holdings_each=1)
    big.pod_resources[0].containers[0].devices[0].device_ids.append("x" * MAX_ANSWER_BYTES)
    path = sock_dir / "kubelet.sock"
    server = grpc.server(ThreadPoolExecutor(2), options=[("grpc.max_send_message_length", -1)])
    podresources_grpc.add_PodResourcesListerServicer_to_server(_Lister(big), server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    client = PodResourcesClient(path)
    try:
        with pytest.raises(PodResourcesUnavailable) as refused:
            client.list("nvidia.com/")
        assert str(refused.value).startswith(f"PodResources List on {path} failed: RESOURCE_EXHAUSTED: ")
    finally:
        client.close()
        server.stop(None)
