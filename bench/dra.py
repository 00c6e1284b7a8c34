"""The DRA kubelet plugin (`nvdp dra-kubelet-plugin`, simulated dgx-a100-mig) as a real process with
the kubelet stand-in (its plugin watcher and DRA manager, this process) and the API stand-in (the real
`kubernetes` client in the plugin): process start until the ResourceSlice is published (budget 1 s),
a MIG re-partition (a line appended to $NVDP_SIM_EVENTS) until the slice says the new layout (budget
1 s, on max), NodePrepareResources of a one-GPU claim (the claim read through the API, the CDI spec and
the checkpoint written; budget 20 ms, p50) and NodeUnprepareResources, the process's peak RSS after
that load with its metrics endpoint on and scraped (the side commands' 80 MB) and its idle CPU and
wake-ups (the plugin's idle budget).

Run alone: `python -m bench.dra [--idle-seconds S]` prints the rows; `python -m bench` includes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.budgets import (
    DRA_IDLE_BUDGET_PCT,
    DRA_LAYOUT_BUDGET_MS,
    DRA_MIG_PREPARE_BUDGET_MS,
    DRA_PREPARE_BUDGET_MS,
    DRA_START_BUDGET_MS,
    SIDE_RSS_BUDGET_MB,
)
from bench.dra_capacity import measure_capacity
from bench.sampling import Sample
from bench.table import MIB, Row, megabytes
from nvdp.sim.kubelet.dra import Claim
from testkit import ProcStats, append_sim_event, free_port, http_get, sim_gpus, wait_until
from testkit.dra import claim_path, dra_cluster, make_claim, published, schedule, slices_of

LAYOUTS = (["3g.20gb", "3g.20gb"], ["1g.5gb"] * 7)  # GPU 0 of dgx-a100-mig, back and forth
FIRST_DEVICE = ("gpu-0-mig-3g20gb-9-0", "gpu-0-mig-1g5gb-19-0")  # what each layout publishes first on GPU 0


def measure(workdir: Path, claims: int, starts: int, layout_changes: int, idle_seconds: float) -> list[Row]:
    rows: list[Row] = []
    events = workdir / "events.jsonl"
    events.touch()
    gpu0 = sim_gpus("dgx-a100-mig")[0].uuid
    with dra_cluster(workdir, "sim:dgx-a100-mig", env={"NVDP_SIM_EVENTS": str(events)}) as cluster:
        port = free_port()  # the metrics endpoint on, as the chart runs it; scraped under the load
        cluster.metrics_address = f"127.0.0.1:{port}"
        start = Sample()
        for n in range(starts):
            for path in [p for p in cluster.api.objects if "/resourceslices/" in p]:
                cluster.api.delete(path)
            process = cluster.start()
            wait_until(lambda: slices_of(cluster.api), 30, "the slice")
            start.latencies.append(time.monotonic() - process.started)
            cluster.registered(after=n)
            if n < starts - 1:
                process.stop()
        rows.append(start.row("process start -> ResourceSlice published", "dra", rate=False))
        judge(rows[-1], rows[-1].p50, DRA_START_BUDGET_MS, "p50")

        layout = Sample()
        for n in range(layout_changes):
            target = (n + 1) % 2
            time.sleep(random.random())  # at any moment between two rescans
            append_sim_event(events, uuid=gpu0, mig=LAYOUTS[target])
            t0 = time.monotonic()
            wait_until(
                partial(_publishes, published, cluster.api, FIRST_DEVICE[target]), 10, "the new layout"
            )
            layout.latencies.append(time.monotonic() - t0)
        rows.append(layout.row("MIG re-partition -> ResourceSlice (default rescan)", "dra", rate=False))
        judge(rows[-1], rows[-1].max, DRA_LAYOUT_BUDGET_MS, "max")

        prepare, unprepare = Sample(), Sample()
        for n in range(claims):
            claim = make_claim(cluster.api, f"bench-{n}")
            schedule(cluster.api, claim)
            prepare.latencies.append(_timed(cluster.kubelet.node_prepare, claim))
            unprepare.latencies.append(_timed(cluster.kubelet.node_unprepare, claim))
            cluster.api.delete(claim_path(claim.namespace, claim.name))  # the pod and its claim are gone
            if n % 10 == 0:  # a Prometheus scrape and the kubelet's probes now and then
                assert all(http_get(port, path)[0] == 200 for path in ("/metrics", "/healthz", "/readyz"))
        rows.append(
            prepare.row(
                "NodePrepareResources, one-GPU claim (API read, CDI spec, checkpoint)", "dra", rate=False
            )
        )
        judge(rows[-1], rows[-1].p50, DRA_PREPARE_BUDGET_MS, "p50")
        rows.append(unprepare.row("NodeUnprepareResources, one-GPU claim", "dra", rate=False))
        assert json.loads(cluster.node.checkpoint.read_text())["claims"] == {}

        assert cluster.process is not None
        pid = cluster.process.pid
        peak = ProcStats.read(pid).peak_rss_mib
        rows.append(
            Row(
                "peak RSS after the load",
                "dra",
                value=megabytes(peak),
                budget=f"{SIDE_RSS_BUDGET_MB:.0f} MB",
                ok=peak * MIB / 1e6 <= SIDE_RSS_BUDGET_MB,
            )
        )
        if idle_seconds > 0:  # a fresh process without the events file (its follower polls every 20 ms)
            cluster.process.stop()
            cluster.env.pop("NVDP_SIM_EVENTS")
            process = cluster.start()
            cluster.registered(after=starts)
            wait_until(lambda: cluster.log().count("device rescan started") > starts, 30, "started")
            wait_until(
                lambda: (
                    cluster.log().count("ResourceSlices published") >= starts + 1 or slices_of(cluster.api)
                ),
                30,
                "published",
            )
            time.sleep(1.0)
            before, t0 = ProcStats.read(process.pid), time.monotonic()
            time.sleep(idle_seconds)
            after, elapsed = ProcStats.read(process.pid), time.monotonic() - t0
            cpu_ms = (after.cpu_s - before.cpu_s) * 1e3
            pct = cpu_ms / 10 / elapsed
            wakeups = (after.switches - before.switches) / elapsed
            rows.append(
                Row(
                    "idle (slice watch open, default rescan)",
                    "dra",
                    f"{elapsed:.0f} s",
                    value=f"{cpu_ms:.0f} ms CPU = {pct:.3f}% core, {wakeups:.0f} wake-ups/s",
                    budget=f"{DRA_IDLE_BUDGET_PCT}% core",
                    ok=pct <= DRA_IDLE_BUDGET_PCT,
                )
            )
    return rows


def measure_dynamic_mig(workdir: Path, claims: int) -> list[Row]:
    """NodePrepareResources / NodeUnprepareResources of a claim for a 1g.5gb placement on a node whose
    MIG devices are made per claim (`dra.dynamicMig: all`, simulated dgx-a100-mig-empty): the claim read,
    the GPU instance and compute instance made (simulated NVML), the CDI spec and the checkpoint
    written; unprepare destroys them."""
    from testkit.dra import DYNAMIC_ALL, PROFILE
    from testkit.driver_root import cap_files

    prepare, unprepare = Sample(), Sample()
    with dra_cluster(workdir, "sim:dgx-a100-mig-empty", config=DYNAMIC_ALL) as cluster:
        cap_files(cluster.node.driver_root, sim_gpus("dgx-a100-mig-empty"))
        cluster.start()
        cluster.registered()
        wait_until(lambda: len(slices_of(cluster.api)) == 5, 30, "the slices")
        for n in range(claims):
            claim = make_claim(cluster.api, f"mig-{n}", "mig.nvidia.com", PROFILE.format("1g.5gb"))
            schedule(cluster.api, claim)
            prepare.latencies.append(_timed(cluster.kubelet.node_prepare, claim))
            unprepare.latencies.append(_timed(cluster.kubelet.node_unprepare, claim))
            cluster.api.delete(claim_path(claim.namespace, claim.name))
        assert cluster.log().count("MIG device destroyed device=") == claims  # each made and gone
    rows = [prepare.row("NodePrepareResources, dynamic MIG claim (1g.5gb made)", "dra", rate=False)]
    judge(rows[-1], rows[-1].p50, DRA_MIG_PREPARE_BUDGET_MS, "p50")
    rows.append(unprepare.row("NodeUnprepareResources, dynamic MIG claim (destroyed)", "dra", rate=False))
    return rows


def _publishes(published: Callable[[Any], dict[str, Any]], api: Any, device: str) -> bool:
    return device in published(api)


def judge(row: Row, measured_ms: float | None, budget_ms: float, on: str) -> None:
    row.budget = f"{budget_ms:g} ms ({on})"
    row.ok = measured_ms is not None and measured_ms <= budget_ms


def _timed(call: Callable[[str, list[Claim]], object], claim: Claim) -> float:
    """One call of the kubelet stand-in's to the plugin, for one claim: its wall time."""
    t0 = time.perf_counter()
    call("gpu.nvidia.com", [claim])
    return time.perf_counter() - t0


def section(s: object) -> None:
    """`python -m bench`'s section (s: bench.session.Session)."""
    from bench.session import Session

    assert isinstance(s, Session)
    quick = s.o.quick
    s.progress("DRA kubelet plugin: start, re-partition, prepare, RSS, idle (bench/dra.py)")
    rows = measure(
        s.fresh_dir("dra"),
        claims=50 if quick else 200,
        starts=2 if quick else 5,
        layout_changes=2 if quick else 6,
        idle_seconds=0.0 if quick else min(s.o.idle_seconds, 20.0),
    )
    rows += measure_dynamic_mig(s.fresh_dir("dra-mig"), claims=30 if quick else 100)
    s.table.section("DRA kubelet plugin (dgx-a100-mig simulated, API stand-in, bench/dra.py)").extend(rows)
    shares = measure_capacity(s.fresh_dir("dra-capacity"), claims=40 if quick else 160)
    s.table.section("DRA, GPUs shared by capacity (dgx-a100 simulated, MPS stand-in)").extend(shares)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-dra-", dir="/tmp") as work:
        rows = [*measure(Path(work), 200, 5, 6, args.idle_seconds), *measure_capacity(Path(work), 160)]
        for row in rows + measure_dynamic_mig(Path(work) / "mig", 100):
            numbers = "" if row.p50 is None else f" p50 {row.p50:.1f} ms, max {row.max:.1f} ms, n={row.n}"
            print(f"{row.measurement}:{numbers} {row.value} [budget {row.budget or '-'}: {row.ok}]")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
