"""One GPU, one API, as processes: `nvdp plugin` (with the kubelet stand-in, PodResources served) and
`nvdp dra-kubelet-plugin` (with the kubelet's DRA side and the API stand-in) on one node, reading one
config file. Both sides' histories are kept (the kubelet's ListAndWatch updates of nvidia.com/gpu, the
API server's writes of the node's ResourceSlices, each with the time it arrived): across every switch no
GPU is ever advertised by both, at any moment.
A GPU a pod holds through one API stays with it (one WARNING line on each side) until the pod ends."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from nvdp.base.timers import as_env
from nvdp.sim.kubelet import Kubelet
from nvdp.sim.kubelet.node_status import NodeStatusMirror
from testkit import Process, start_plugin, wait_until
from tests.builders import sim_gpus
from tests.dra_support import (
    DRIVER,
    V1,
    DraCluster,
    dra_cluster,
    make_claim,
    node_status_writer,
    published,
    schedule,
)
from tests.kube_api_standin import KubeApiStandin

GPU = "nvidia.com/gpu"
UUIDS = [g.uuid for g in sim_gpus("pcie-4")]
SPLIT = "version: v1\ndra:\n  devices: [2, 3]\n"  # GPUs 0, 1: the device plugin's; 2, 3: DRA's
ALL_DRA = "version: v1\ndra:\n  devices: all\n"
NO_DRA = "version: v1\ndra:\n  devices: none\n"
# A GPU waiting for a pod or claim to end is looked at again every 0.1-0.3 s (production: 2.5-7.5 s).
FAST_HANDOFF = as_env(handoff_retry=0.2)


class TwoApiNode:
    def __init__(self, cluster: DraCluster, kubelet: Kubelet, plugin: Process, dra: Process) -> None:
        self.cluster, self.kubelet, self.plugin, self.dra = cluster, kubelet, plugin, dra
        self.config = Path(cluster.env["CONFIG_FILE"])

    def by_plugin(self) -> frozenset[str]:
        if GPU not in self.kubelet.resources():
            return frozenset()
        return frozenset(i for i, d in self.kubelet.devices(GPU).items() if d.health == "Healthy")

    def by_dra(self) -> frozenset[str]:
        return frozenset(d["attributes"]["uuid"]["string"] for d in published(self.cluster.api).values())

    def switch(self, config: str) -> None:
        """The config-manager's work: a new file, then SIGHUP to both."""
        self.config.write_text(config)
        self.plugin.send(signal.SIGHUP)
        self.dra.send(signal.SIGHUP)

    def serving(self, plugin: list[str], dra: list[str], timeout: float, what: str) -> None:
        want = (frozenset(plugin), frozenset(dra))
        wait_until(lambda: (self.by_plugin(), self.by_dra()) == want or None, timeout, what)

    def timeline(self) -> list[tuple[float, str, frozenset[str]]]:
        """Every change of what each API advertised, as its consumer saw it and when: the kubelet's
        ListAndWatch updates (Healthy devices; none once a stream ended) and the API server's writes
        of the node's ResourceSlices (their devices' GPUs)."""
        changes = [
            (u.time, "plugin", frozenset(i for i, d in u.devices.items() if d.health == "Healthy"))
            for u in self.kubelet.updates(GPU)
        ]
        changes += [(end.time, "plugin", frozenset()) for end in self.kubelet.stream_ends(GPU)]
        slices: dict[str, frozenset[str]] = {}
        for at, path, obj in self.cluster.api.writes(f"{V1}/resourceslices/"):
            devices = (obj or {}).get("spec", {}).get("devices") or []
            slices[path] = frozenset(d["attributes"]["uuid"]["string"] for d in devices)
            changes.append((at, "dra", frozenset().union(*slices.values())))
        return sorted(changes, key=lambda change: change[0])


def overlaps(timeline: list[tuple[float, str, frozenset[str]]]) -> list[tuple[float, frozenset[str]]]:
    """The moments both APIs advertised a GPU, and which."""
    now = {"plugin": frozenset[str](), "dra": frozenset[str]()}
    found = []
    for at, api, gpus in timeline:
        now[api] = gpus
        if now["plugin"] & now["dra"]:
            found.append((at, now["plugin"] & now["dra"]))
    return found


@contextmanager
def one_node(
    tmp_path: Path, status_delay: float | None = None, timers: Mapping[str, str] = FAST_HANDOFF
) -> Iterator[TwoApiNode]:
    """Both plugins on one node; with `status_delay` the kubelet's device counts reach the Node's
    status that many seconds late (the kubelet's status update). `timers`: both processes' env."""
    with dra_cluster(tmp_path, config=SPLIT, env=timers) as cluster:
        plugin_dir = cluster.node.root / "device-plugins"  # beside plugins/: the records are found
        kubelet = Kubelet(plugin_dir, pod_resources=True)
        kubelet.start()
        mirror = None
        if status_delay is not None:
            mirror = NodeStatusMirror(kubelet, node_status_writer(cluster.api), status_delay)
            mirror.start()
        plugin = start_plugin(
            plugin_dir,
            cluster.nvml,
            config_file=Path(cluster.env["CONFIG_FILE"]),
            env=timers,
            log_path=tmp_path / "plugin.log",
        )
        try:
            dra = cluster.start()
            cluster.registered()
            kubelet.wait_for_registration(GPU, timeout=20)
            yield TwoApiNode(cluster, kubelet, plugin, dra)
        finally:
            plugin.stop()
            if mirror is not None:
                mirror.stop()
            kubelet.stop()
            if cluster.process is not None:
                cluster.process.stop()
            (tmp_path / "dra.log").write_text(cluster.log())  # the cluster's directory goes


def test_gpus_move_between_the_apis_and_never_are_advertised_by_both(tmp_path: Path) -> None:
    with one_node(tmp_path) as node:
        node.serving(UUIDS[:2], UUIDS[2:], 20, "GPUs 0, 1 by the plugin, 2, 3 by DRA")

        # A pod holds one GPU through the device plugin; then the node's entry gives DRA every GPU.
        (held,) = node.kubelet.admit_pod("ml", "train", {"main": {GPU: 1}}).assignments[0].device_ids
        free = next(u for u in UUIDS[:2] if u != held)
        node.switch(ALL_DRA)
        node.serving([held], [free, *UUIDS[2:]], 20, "all but the held GPU moved to DRA")
        index = UUIDS.index(held)
        kept = f"GPU {index} ({held}): the config gives it to the DRA driver, but pod ml/train holds it"
        waits = (
            f"GPU {index} ({held}): the config gives it to the DRA driver, but pod ml/train holds it through"
        )
        wait_until(lambda: kept in node.plugin.log() and waits in node.dra.log(), 10, "both sides say why")

        node.kubelet.remove_pod("ml", "train")  # the pod ended: the GPU follows the config
        node.serving([], UUIDS, 30, "every GPU by DRA")

        # A claim holds a GPU through DRA; then the entry gives every GPU back to the device plugin.
        claim = make_claim(node.cluster.api, "c1")
        (device,) = schedule(node.cluster.api, claim)
        node.cluster.kubelet.start_pod("pod-1", DRIVER, [claim])
        on_claim = next(
            d["attributes"]["uuid"]["string"] for n, d in published(node.cluster.api).items() if n == device
        )
        node.switch(NO_DRA)
        others = [u for u in UUIDS if u != on_claim]
        node.serving(others, [on_claim], 20, "all but the claimed GPU back to the plugin")
        wait_until(lambda: "claim ns/c1 holds it through the DRA driver" in node.plugin.log(), 10, "said")

        node.cluster.kubelet.end_pod("pod-1", DRIVER, [claim])  # unprepared: the GPU follows
        node.serving(UUIDS, [], 20, "every GPU by the plugin")

        timeline = node.timeline()
    assert len(timeline) >= 10  # every switch seen on both sides
    assert overlaps(timeline) == []
    plugin_log, dra_log = ((tmp_path / name).read_text() for name in ("plugin.log", "dra.log"))
    assert "Traceback" not in plugin_log + dra_log
    # each hold said once on each side, however many times the hand-over looked again
    assert plugin_log.count(kept) == 1
    assert dra_log.count(waits) == 1


STATUS_DELAY_S = 1.0  # the kubelet's status update lags its device manager (3.8-9.0 s seen on a cluster)


def api_view(api: KubeApiStandin) -> list[tuple[float, int, frozenset[str]]]:
    """What the scheduler sees of the node after each write: the Node's allocatable nvidia.com/gpu and
    the GPUs the ResourceSlices offer."""
    view, allocatable, slices = [], 0, dict[str, frozenset[str]]()
    for at, path, obj in api.writes("/"):
        if path == "/api/v1/nodes/node-a":
            allocatable = int(((obj or {}).get("status") or {}).get("allocatable", {}).get(GPU, "0"))
        elif path.startswith(f"{V1}/resourceslices/"):
            devices = (obj or {}).get("spec", {}).get("devices") or []
            slices[path] = frozenset(d["attributes"]["uuid"]["string"] for d in devices)
        else:
            continue
        view.append((at, allocatable, frozenset().union(*slices.values())))
    return view


def offered_at(view: list[tuple[float, int, frozenset[str]]], gpus: list[str], after: float) -> float:
    return next(at for at, _, offered in view if at > after and set(gpus) <= offered)


def test_the_scheduler_never_sees_a_gpu_in_both_apis(tmp_path: Path) -> None:
    """The Node's allocatable lags the device plugin's ListAndWatch: a GPU moved to DRA is offered in a
    slice only once the Node no longer counts it; one moved back is counted only once no slice offers it."""
    with one_node(tmp_path, status_delay=STATUS_DELAY_S) as node:
        api = node.cluster.api
        node.serving(UUIDS[:2], UUIDS[2:], 20, "GPUs 0, 1 by the plugin, 2, 3 by DRA")
        api.wait_for(lambda: api_view(api)[-1][1] == 2, 20, "the Node counting GPUs 0, 1")

        moved = node.kubelet.updates(GPU)[-1].time
        node.switch(ALL_DRA)  # GPUs 0, 1: the plugin's stream ends; the Node counts them for 1 s more
        node.serving([], UUIDS, 20, "every GPU by DRA")
        node.kubelet.wait_for(lambda: node.kubelet.stream_ends(GPU) or None, 10, "the stream's end")
        withdrawn = node.kubelet.stream_ends(GPU)[-1].time
        to_dra = offered_at(api_view(api), UUIDS[:2], moved) - withdrawn

        back = time.monotonic()
        node.switch(NO_DRA)  # every GPU back: counted by the Node only after the slices let them go
        node.serving(UUIDS, [], 20, "every GPU by the plugin")
        api.wait_for(lambda: api_view(api)[-1][1] == 4, 20, "the Node counting every GPU")

        node.switch(SPLIT)  # GPUs 2, 3 to DRA while the plugin keeps 0, 1: the Node's capacity decides
        node.serving(UUIDS[:2], UUIDS[2:], 20, "GPUs 0, 1 by the plugin, 2, 3 by DRA again")
        split = node.kubelet.updates(GPU)[-1].time
        to_dra_again = offered_at(api_view(api), UUIDS[2:], back) - split
        view = api_view(api)
        timeline = node.timeline()
    twice = [
        (at, allocatable, offered) for at, allocatable, offered in view if allocatable + len(offered) > 4
    ]
    assert twice == []
    assert overlaps(timeline) == []
    assert to_dra >= STATUS_DELAY_S * 0.9 and to_dra_again >= STATUS_DELAY_S * 0.9
    dra_log = (tmp_path / "dra.log").read_text()
    assert dra_log.count("GPUs offered once the Node stopped counting them") == 2


def test_a_gpu_goes_back_to_the_plugin_only_once_the_api_server_took_it_out_of_the_slices(
    tmp_path: Path,
) -> None:
    """The DRA driver's record lets a GPU go once the API server answered the slice write that
    withdrew it: while those writes fail, the device plugin waits."""
    with one_node(tmp_path) as node:
        api = node.cluster.api
        node.serving(UUIDS[:2], UUIDS[2:], 20, "GPUs 0, 1 by the plugin, 2, 3 by DRA")
        (path,) = (p for p in api.objects if p.startswith(f"{V1}/resourceslices/"))
        api.fail(500, 1000, method="PUT", path_prefix=path)
        tried = api.count("PUT", path)
        node.switch(NO_DRA)
        api.wait_for(lambda: api.count("PUT", path) >= tried + 2, 20, "two failed slice writes")
        assert (node.by_plugin(), node.by_dra()) == (frozenset(UUIDS[:2]), frozenset(UUIDS[2:]))
        api.clear_failures()
        node.serving(UUIDS, [], 20, "every GPU by the plugin once the slice was written")
        timeline = node.timeline()
    assert overlaps(timeline) == []
