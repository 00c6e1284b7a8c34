"""NodePrepareResources of a claim's share of a GPU shared by capacity (`dra.consumableCapacity: all`,
simulated dgx-a100, the MPS stand-in as nvidia-cuda-mps-control): the claim read through the API, its
consumedCapacity checked, the GPU's MPS daemon started at its first claim and waited for (a later claim
finds it ready: no control command), the CDI spec with the MPS client's env and mounts and the
checkpoint written. Claims go round the eight GPUs and each is unprepared once the next claim on its
GPU is prepared (a GPU's daemon runs while a claim holds it), so the eight daemon starts are among the
samples; budget 50 ms, p50."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.budgets import DRA_CAPACITY_PREPARE_BUDGET_MS
from bench.sampling import Sample
from bench.table import Row
from testkit import wait_until

CONFIG = "version: v1\nflags:\n  mpsRoot: {root}\ndra:\n  devices: all\n  consumableCapacity: all\n"


def measure_capacity(workdir: Path, claims: int) -> list[Row]:
    from testkit.dra import claim_path, dra_cluster, make_claim, schedule, slices_of
    from testkit.mps_control import Standin

    standin = Standin(workdir / "mps-standin")
    prepare, unprepare = Sample(), Sample()
    with dra_cluster(workdir, "sim:dgx-a100", env=standin.on_path()) as cluster:
        (cluster.node.root / "config.yaml").write_text(CONFIG.format(root=cluster.node.root / "mps"))
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 30, "the slices")
        held: list[Any] = []
        for n in range(claims):
            selector = f"device.attributes['gpu.nvidia.com'].index == {n % 8}"
            claim = make_claim(cluster.api, f"share-{n}", selector=selector, capacity={"memory": "2Gi"})
            schedule(cluster.api, claim)
            t0 = time.perf_counter()
            answer = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
            prepare.latencies.append(time.perf_counter() - t0)
            assert not answer.error, answer.error
            held.append(claim)
            while len(held) > 8 or (n == claims - 1 and held):  # the claim before on this GPU
                done = held.pop(0)
                t0 = time.perf_counter()
                cluster.kubelet.node_unprepare("gpu.nvidia.com", [done])
                unprepare.latencies.append(time.perf_counter() - t0)
                cluster.api.delete(claim_path(done.namespace, done.name))
    row = prepare.row("NodePrepareResources, a 2Gi share (8 daemon starts among them)", "dra", rate=False)
    row.budget = f"{DRA_CAPACITY_PREPARE_BUDGET_MS:g} ms (p50)"
    row.ok = row.p50 is not None and row.p50 <= DRA_CAPACITY_PREPARE_BUDGET_MS
    return [row, unprepare.row("NodeUnprepareResources, a share", "dra", rate=False)]
