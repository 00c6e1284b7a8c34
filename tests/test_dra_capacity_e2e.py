"""`nvdp dra-kubelet-plugin` with `dra.consumableCapacity`, as a process over real sockets and files:
the golden slices published, three claims sharing one GPU as the stand-in scheduler accounts them,
each prepared as an MPS client of the GPU's control daemon (the MPS stand-in on PATH), started once
at the first claim, held by the claims and quit after the last, and what each client got; a daemon
that cannot start fails the claim, one line."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nvdp.sim.kubelet.dra import Claim
from testkit import wait_until
from tests.dra_support import DraCluster, dra_cluster, make_claim, published, schedule, slices_of
from tests.mps_standin import Standin

GOLDEN = Path(__file__).parent / "data" / "dra" / "slices-dgx-a100-capacity.json"
GPU0 = "GPU-925be680-6786-5653-edfc-0f1c7087259e"  # dgx-a100's GPU 0
INDEX_0 = "device.attributes['gpu.nvidia.com'].index == 0"


@contextmanager
def shared_node(tmp_path: Path) -> Iterator[tuple[DraCluster, Standin, Path]]:
    """dgx-a100 with every GPU shared by capacity, the MPS stand-in on the plugin's PATH."""
    standin = Standin(tmp_path / "mps-standin")
    with dra_cluster(tmp_path, "sim:dgx-a100", env=standin.on_path()) as cluster:
        root = cluster.node.root / "mps"
        config = f"version: v1\nflags:\n  mpsRoot: {root}\ndra:\n  devices: all\n  consumableCapacity: all\n"
        (cluster.node.root / "config.yaml").write_text(config)
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 5, "the slices")
        yield cluster, standin, root


def cdi_container_env(spec: dict[str, Any]) -> dict[str, str]:
    """The env a container of the claim gets from its CDI spec (the spec's edits, then its device's)."""
    edits = [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
    return dict(e.split("=", 1) for edit in edits for e in edit.get("env") or [])


def test_three_claims_share_a_gpu_each_limited_to_its_share(tmp_path: Path) -> None:
    with shared_node(tmp_path) as (cluster, standin, root):
        assert [s["spec"] for s in slices_of(cluster.api)] == [
            g["spec"] for g in json.loads(GOLDEN.read_text())
        ]
        asked = {"a": {"memory": "10Gi", "compute": "50"}, "b": {"memory": "1500Mi"}, "c": None}
        claims = {
            name: make_claim(cluster.api, name, selector=INDEX_0, capacity=cap) for name, cap in asked.items()
        }
        for claim in claims.values():
            assert schedule(cluster.api, claim) == ["gpu-0"]
        prepared = cluster.kubelet.node_prepare("gpu.nvidia.com", list(claims.values())).claims
        assert {name: prepared[c.uid].error for name, c in claims.items()} == dict.fromkeys(asked, "")
        pipe = root / "gpu.nvidia.com" / GPU0 / "pipe"
        started = [c for c in standin.commands(pipe) if not c.startswith("get_")]  # no health queries
        assert started == ["-d", "set_default_active_thread_percentage 100"]  # once for three claims
        assert {c["visible"] for c in standin.calls()} == {GPU0}
        specs = cluster.specs()
        limits = {}
        for name, claim in claims.items():
            env = cdi_container_env(specs[f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"])
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
            connected = standin.connect(name, env)
            assert connected.returncode == 0, connected.stderr
            limits[name] = (standin.clients()[name]["pinned"], standin.clients()[name]["threads"])
        assert limits == {
            "a": (f"{GPU0}=10240M", "50"),
            "b": (f"{GPU0}=2048M", None),  # 1500Mi rounded up to the 1Gi step
            "c": (f"{GPU0}=1024M", None),  # the defaults: 1Gi, no compute cap
        }
        assert "compute mode set gpu=" + GPU0 + " mode=EXCLUSIVE_PROCESS" in cluster.log()
        assert (
            f'claim\'s share claim=ns/a gpu={GPU0} shares="gpu-0: memory 10Gi, compute 50%"' in cluster.log()
        )

        holders = root / "gpu.nvidia.com" / GPU0 / "holders.json"  # the daemon is held by its claims
        assert json.loads(holders.read_text())["holders"] == sorted(c.uid for c in claims.values())

        unprepared = cluster.kubelet.node_unprepare("gpu.nvidia.com", list(claims.values())[:2]).claims
        assert all(not r.error for r in unprepared.values()) and standin.running(pipe)
        last = cluster.kubelet.node_unprepare("gpu.nvidia.com", [claims["c"]]).claims
        assert not last[claims["c"].uid].error and cluster.specs() == {}
        assert standin.commands(pipe)[-1] == "quit" and not standin.running(pipe)  # the last claim gone
        assert json.loads(holders.read_text())["holders"] == []
        assert f"compute mode set gpu={GPU0} mode=DEFAULT" in cluster.log()


def test_a_daemon_that_cannot_start_fails_the_claim_in_one_line(tmp_path: Path) -> None:
    with shared_node(tmp_path) as (cluster, standin, _):
        standin.fail_start(1)
        claim = make_claim(cluster.api, "first", selector=INDEX_0, capacity={"memory": "2Gi"})
        schedule(cluster.api, claim)
        answer = cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid]
        assert answer.error == (
            f"ResourceClaim ns/first: gpu-0: MPS daemon {GPU0} is not ready: MPS daemon failed to start: "
            "nvidia-cuda-mps-control: start the MPS control daemon failed with exit status 1: "
            "stand-in: told to fail -d"
        )
        assert cluster.specs() == {}
        whole = Claim("ns", "first", claim.uid)
        assert not cluster.kubelet.node_unprepare("gpu.nvidia.com", [whole]).claims[claim.uid].error


def test_a_gpu_with_a_share_stays_shared_until_unprepared_after_a_reload(tmp_path: Path) -> None:
    with shared_node(tmp_path) as (cluster, _, _):
        claim = make_claim(cluster.api, "kept", selector=INDEX_0, capacity={"memory": "4Gi"})
        schedule(cluster.api, claim)
        assert not cluster.kubelet.node_prepare("gpu.nvidia.com", [claim]).claims[claim.uid].error
        config = cluster.node.root / "config.yaml"
        config.write_text(config.read_text().replace("consumableCapacity: all", "consumableCapacity: none"))
        assert cluster.process is not None
        cluster.process.send(signal.SIGHUP)

        def shared() -> list[str]:
            return [d["name"] for d in published(cluster.api).values() if d.get("allowMultipleAllocations")]

        wait_until(lambda: shared() == ["gpu-0"], 10, "only gpu-0, with its share, still shared")
        cluster.kubelet.node_unprepare("gpu.nvidia.com", [claim])
        wait_until(lambda: shared() == [], 10, "gpu-0 published whole once its share is unprepared")
