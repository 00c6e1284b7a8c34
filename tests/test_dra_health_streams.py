"""The DRA plugin keeps a health-stream place for the kubelet: other clients filling the bound
never lock the kubelet's stream out, across a kubelet restart too (`nvdp dra-kubelet-plugin` as a
process, the kubelet stand-in's plugin watcher and DRA manager)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc

from nvdp.api.dra import RESOURCE_HEALTH
from nvdp.plugins.dra.health import MAX_STREAMS
from testkit import wait_until
from tests.dra_support import dra_cluster

DRIVER = "gpu.nvidia.com"


@contextmanager
def foreign_stream(endpoint: str, service: str) -> Iterator[None]:
    """A health stream of a client that is not the kubelet, admitted (its first answer arrived) and
    open until the block ends."""
    wire = RESOURCE_HEALTH[service]
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        call = wire.grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            wire.pb.NodeWatchResourcesRequest()
        )
        answers: list[object] = []
        first = threading.Thread(target=lambda: answers.append(next(call)), daemon=True)
        first.start()
        first.join(10)
        assert answers, "a stream within the bound was not admitted"
        yield
        call.cancel()


def refusal(endpoint: str, service: str) -> grpc.RpcError:
    wire = RESOURCE_HEALTH[service]
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        call = wire.grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            wire.pb.NodeWatchResourcesRequest(), timeout=10
        )
        try:
            next(call)
        except grpc.RpcError as error:
            return error
    raise AssertionError("the stream was admitted")


def test_other_clients_never_lock_the_kubelet_out(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster, ExitStack() as others:
        cluster.start()
        cluster.registered()
        plugin = cluster.kubelet.plugin(DRIVER)
        cluster.kubelet.watch_health(DRIVER)
        wait_until(lambda: len(cluster.kubelet.health_updates) == 1, 10, "the kubelet's first health list")

        for _ in range(MAX_STREAMS - 1):
            others.enter_context(foreign_stream(plugin.endpoint, plugin.health_service))
        error = refusal(plugin.endpoint, plugin.health_service)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.details() == (
            f"at most {MAX_STREAMS} health streams (one kept for the kubelet); close another first"
        )

        cluster.watcher.restart()  # a kubelet restart: GetInfo again, and its stream comes next
        cluster.registered(after=1)
        cluster.kubelet.watch_health(DRIVER)
        wait_until(lambda: len(cluster.kubelet.health_updates) == 2, 10, "the restarted kubelet's list")
        assert cluster.process is not None and cluster.process.alive()
