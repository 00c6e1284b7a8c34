"""One NodePrepareResources call with many claims (and its NodeUnprepareResources), through the DRA
kubelet plugin as a real process, the kubelet stand-in and the API stand-in: each claim allocated one
of the node's GPUs in the API and reserved for a pod (the call's cost is the plugin's per-claim work:
the API read, the CDI spec, the checkpoint).

Run alone: `python -m bench.dra_batch [--claims 1000 3000]` prints one row per size and call.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.table import Row
from nvdp.sim.kubelet.dra import Claim

RPC_TIMEOUT_S = 600.0


def allocated_claim(n: int, devices: int) -> tuple[str, dict[str, object]]:
    """The API path and object of claim `n`: allocated GPU n % `devices` of node-a, reserved for a pod."""
    from testkit.dra import claim_path

    name = f"batch-{n}"
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": f"gpu-{n % devices}"}
    return claim_path("ns", name), {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": f"pod-{n}", "uid": f"pod-uid-{n}"}],
        },
    }


def measure(workdir: Path, sizes: list[int]) -> list[Row]:
    from testkit import wait_until
    from testkit.dra import dra_cluster, slices_of

    rows: list[Row] = []
    for size in sizes:
        with dra_cluster(workdir) as cluster:
            cluster.kubelet.rpc_timeout = RPC_TIMEOUT_S
            cluster.start()
            cluster.registered()
            wait_until(lambda: slices_of(cluster.api), 30, "the slice")
            claims = []
            for n in range(size):
                path, obj = allocated_claim(n, 4)
                cluster.api.put(path, obj)
                claims.append(Claim("ns", f"batch-{n}", f"uid-batch-{n}"))
            t0 = time.monotonic()
            answer = cluster.kubelet.node_prepare("gpu.nvidia.com", claims)
            prepared = time.monotonic() - t0
            errors = [c.error for c in answer.claims.values() if c.error]
            assert len(answer.claims) == size and not errors, errors[:3]
            rows.append(
                Row(f"NodePrepareResources, {size} claims in one call", "dra", value=f"{prepared:.2f} s")
            )
            t0 = time.monotonic()
            answer = cluster.kubelet.node_unprepare("gpu.nvidia.com", claims)
            unprepared = time.monotonic() - t0
            assert not [c.error for c in answer.claims.values() if c.error]
            rows.append(
                Row(f"NodeUnprepareResources, {size} claims in one call", "dra", value=f"{unprepared:.2f} s")
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra_batch")
    parser.add_argument("--claims", type=int, nargs="+", default=[1000, 3000])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nvdp-bench-") as workdir:
        for row in measure(Path(workdir), args.claims):
            print(f"{row.measurement}: {row.value}")


if __name__ == "__main__":
    main()
