"""Issue 26 item 6: one DRA plugin per node. Two `nvdp dra-kubelet-plugin` processes on one plugin
directory both wrote the node's ResourceSlices; the second is now refused in one line naming the
first one's pid, and exits 1, while the first keeps serving."""

from __future__ import annotations

import signal
from pathlib import Path

from nvdp.plugins.dra.names import PLUGIN_LOCK_FILE
from testkit import Process, start_dra_plugin, wait_until
from tests.dra_support import DRIVER, DraCluster, dra_cluster, make_claim, schedule, slices_of


def second_plugin(cluster: DraCluster, tmp_path: Path) -> Process:
    """Another `nvdp dra-kubelet-plugin` on the node, run until it exits 1."""
    with start_dra_plugin(
        cluster.node,
        cluster.nvml,
        cluster.node.root / "kubeconfig",
        env=cluster.env,
        log_path=tmp_path / "second.log",
    ) as second:
        assert second.wait(30) == 1
    return second


def test_a_second_dra_plugin_on_the_node_exits_naming_the_first(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        first = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 20, "the slices")
        directory = cluster.node.plugins / DRIVER
        lock = directory / PLUGIN_LOCK_FILE
        writes = len(cluster.api.writes("/apis/resource.k8s.io/"))

        second = second_plugin(cluster, tmp_path)
        assert second.log() == (
            f"error: DRA plugin directory {directory} is in use by another nvdp "
            f"(lock {lock} held by pid={first.pid})\n"
        )
        assert len(cluster.api.writes("/apis/resource.k8s.io/")) == writes  # the second wrote nothing

        assert first.alive()  # and serving: a claim is prepared, a SIGHUP reads the GPUs again
        claim = make_claim(cluster.api, "one-gpu")
        assert schedule(cluster.api, claim) == ["gpu-0"]
        cluster.kubelet.start_pod("pod-1", DRIVER, [claim])
        first.send(signal.SIGHUP)
        wait_until(lambda: first.log().count("GPUs enumerated") == 2, 20, "the GPUs read again")
        assert lock.read_text() == f"pid={first.pid}\n"

        first.send(signal.SIGTERM)
        assert first.wait(20) == 0
        assert not lock.exists()  # released: the next plugin takes the directory
        third = cluster.start()
        cluster.registered(after=1)
        wait_until(lambda: lock.exists() and lock.read_text() == f"pid={third.pid}\n", 20, "the lock taken")


def test_a_removed_lock_is_taken_again_so_a_second_plugin_is_still_refused(tmp_path: Path) -> None:
    with dra_cluster(tmp_path) as cluster:
        first = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 20, "the slices")
        lock = cluster.node.plugins / DRIVER / PLUGIN_LOCK_FILE
        lock.unlink()  # a kubelet reinstall cleaning the directory
        wait_until(lambda: lock.exists() and lock.read_text() == f"pid={first.pid}\n", 20, "the lock again")
        second = second_plugin(cluster, tmp_path)
        assert f"held by pid={first.pid}" in second.log()
        assert first.alive()
