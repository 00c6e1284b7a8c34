"""The DRA plugin's state that survives (issue 26): a checkpoint it cannot read deletes no claim's CDI
spec and keeps the claims' GPUs held in the hand-over (the claims rebuilt from the specs and the API,
the file set aside); one malformed claim fails only itself; a claim whose API read hangs holds up no
other NodePrepareResources call; a call's claims cost one checkpoint write."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.kube import new_api_client
from nvdp.kube.resourceclaims import KubeResourceClaims
from nvdp.node.cdi.names import CdiSettings
from nvdp.node.cdi.node_files import DriverFiles
from nvdp.plugins.dra.checkpoint import MAX_CHECKPOINT_BYTES, Checkpoint, PreparedClaim, PreparedDevice
from nvdp.plugins.dra.claim_specs import ClaimSpecs
from nvdp.plugins.dra.claims import ClaimRef
from nvdp.plugins.dra.cluster import KubeResourceApi
from nvdp.plugins.dra.devices import node_devices
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.dra.prepare import ClaimPreparer
from nvdp.sim.kubelet.dra import Claim
from testkit import wait_until
from tests.builders import sim_gpus
from tests.dra_support import DRIVER, claim_path, dra_cluster, make_claim, schedule, serve_dra, slices_of
from tests.kube_api_standin import KubeApiStandin
from tests.odd_files import make_sparse
from tests.test_dra_slices import FACTS

GPUS = [g.uuid for g in sim_gpus("pcie-4")]
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


def reserve(api: KubeApiStandin, claim: Claim, pod: str = "pod-1") -> None:
    """Play the scheduler's last step: the claim reserved for a pod."""
    reserved = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    api.merge_patch(claim_path(claim.namespace, claim.name), {"status": {"reservedFor": reserved}})


def truncated(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def dangling_symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("gone.json"))


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


BAD_CHECKPOINTS: dict[str, Callable[[Path], object]] = {
    "truncated": truncated,
    "empty": lambda p: p.write_bytes(b""),
    "binary": lambda p: p.write_bytes(bytes(range(256)) * 4),
    "over-16-mib": lambda p: make_sparse(p, MAX_CHECKPOINT_BYTES + 1),
    "dangling-symlink": dangling_symlink,
    "fifo": fifo,
    "directory": directory,
    "not-nvdp-json": lambda p: p.write_text('{"version": "other/v9", "claims": {}}'),
}


@pytest.mark.parametrize("spoil", BAD_CHECKPOINTS.values(), ids=BAD_CHECKPOINTS.keys())
def test_an_unreadable_checkpoint_keeps_the_claims_specs_and_holds(
    tmp_path: Path, spoil: Callable[[Path], object]
) -> None:
    """A claim prepared, the plugin stopped, its checkpoint spoiled: the restarted plugin keeps the
    claim's spec, holds its GPU in the hand-over record, sets the file aside, writes a fresh checkpoint,
    answers a repeated NodePrepareResources the same and unprepares the claim."""
    with dra_cluster(tmp_path, "sim:pcie-4") as cluster:
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        claim = make_claim(cluster.api, "train")
        assert schedule(cluster.api, claim) == ["gpu-0"]
        reserve(cluster.api, claim)
        (first,) = cluster.kubelet.start_pod("pod-1", DRIVER, [claim])[claim.uid]
        spec = cluster.node.cdi / f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"
        record = cluster.node.checkpoint.parent / "served-by-dra.json"
        wait_until(lambda: GPUS[0] in json.loads(record.read_text())["holds"], 10, "the hold")
        process.stop()
        spoil(cluster.node.checkpoint)

        process = cluster.start()
        cluster.registered(after=1)
        wait_until(lambda: process.log().count("GPUs enumerated") == 2, 20, "the restart's enumeration")
        assert spec.exists()
        assert json.loads(record.read_text())["holds"] == {GPUS[0]: "claim ns/train"}
        assert "prepared claims rebuilt from their CDI specs and the API claims=1 api=read" in process.log()
        (aside,) = cluster.node.checkpoint.parent.glob("checkpoint.json.bad-*")
        assert f"kept_as={aside}" in process.log()
        assert json.loads(cluster.node.checkpoint.read_text())["claims"][claim.uid]["name"] == "train"

        cluster.api.delete(claim_path("ns", "train"))  # answered from the rebuilt state, not the API
        (again,) = cluster.kubelet.node_prepare(DRIVER, [claim]).claims[claim.uid].devices
        assert again == first
        assert not cluster.kubelet.node_unprepare(DRIVER, [claim]).claims[claim.uid].error
        assert not spec.exists()
        wait_until(lambda: json.loads(record.read_text())["holds"] == {}, 10, "the hold released")


@contextmanager
def preparer_on(tmp_path: Path) -> Iterator[tuple[KubeApiStandin, Any]]:
    """The API stand-in serving resource.k8s.io, and a maker of claim preparers reading it (the
    node's pcie-4 GPUs, claim specs under tmp_path/cdi, the checkpoint tmp_path/checkpoint.json)."""
    with KubeApiStandin() as api:
        serve_dra(api)
        state = NodeState()
        state.set_devices(node_devices(sim_gpus("pcie-4"), FACTS))
        specs = ClaimSpecs(
            CdiSettings(spec_dir=str(tmp_path / "cdi")),
            DriverFiles(),
            lambda: {f"/dev/nvidia{i}": None for i in range(4)} | {"/dev/nvidiactl": None},
        )
        resources = KubeResourceApi(new_api_client(host=api.url, retries=0))

        def make(checkpoint: Checkpoint | None = None) -> ClaimPreparer:
            return ClaimPreparer(
                resources, "node-a", state, specs, checkpoint or Checkpoint(tmp_path / "checkpoint.json")
            )

        yield api, make


def allocated(api: KubeApiStandin, name: str, device: str, *, reserved: bool = True) -> ClaimRef:
    """A claim allocated `device` of node-a in the API (reserved for a pod unless said)."""
    status: dict[str, Any] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device}]}
        }
    }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": f"pod-{name}", "uid": f"uid-pod-{name}"}]
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    api.put(claim_path("ns", name), {"kind": "ResourceClaim", "metadata": meta, "status": status})
    return ClaimRef("ns", name, f"uid-{name}")


def test_without_the_api_the_specs_alone_hold_and_the_api_completes_them_later(tmp_path: Path) -> None:
    with preparer_on(tmp_path) as (api, make):
        ref = allocated(api, "train", "gpu-1")
        first = make().prepare([ref])[ref.uid]
        assert not first.error
        (tmp_path / "checkpoint.json").write_text("{")
        api.fail(503, 5, path_prefix=CLAIMS)

        rebuilt = make()
        assert rebuilt.holders() == {"gpu-1": "claim uid-train"}  # the spec names the claim's devices
        assert (tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_uid-train.json").exists()
        api.clear_failures()
        assert rebuilt.prepare([ref])[ref.uid] == first  # its requests: read from the API again
        assert rebuilt.holders() == {"gpu-1": "claim ns/train"}
        assert make().holders() == {"gpu-1": "claim ns/train"}  # the fresh checkpoint says so


def test_a_rebuilt_claim_stays_held_when_the_checkpoint_cannot_be_written(tmp_path: Path) -> None:
    with preparer_on(tmp_path) as (api, make):
        ref = allocated(api, "train", "gpu-1")
        assert not make().prepare([ref])[ref.uid].error
        checkpoint = tmp_path / "checkpoint.json"
        checkpoint.write_text("{")
        api.fail(503, 1, path_prefix=CLAIMS)
        rebuilt = make()
        checkpoint.unlink()
        checkpoint.mkdir()  # no checkpoint can be written over a directory with a file in it
        (checkpoint / "x").touch()
        error = rebuilt.prepare([ref])[ref.uid].error
        assert error.startswith("ResourceClaim ns/train: ") and "Is a directory" in error
        assert rebuilt.holders() == {"gpu-1": "claim uid-train"}


def test_a_claim_the_api_says_is_reserved_here_is_held_without_a_spec(tmp_path: Path) -> None:
    with preparer_on(tmp_path) as (api, make):
        allocated(api, "running", "gpu-2")
        allocated(api, "not-reserved", "gpu-3", reserved=False)
        (tmp_path / "checkpoint.json").write_bytes(b"\x00\xff")
        assert make().holders() == {"gpu-2": "claim ns/running"}


def test_an_orphan_spec_goes_only_when_the_api_says_its_claim_is_not_here(tmp_path: Path) -> None:
    """A readable checkpoint without a claim whose spec is on disk (a crash between the two writes, or
    NVIDIA's checkpoint adopted): the spec stays while the API says the claim runs here."""
    with preparer_on(tmp_path) as (api, make):
        kept, gone = allocated(api, "kept", "gpu-0"), allocated(api, "gone", "gpu-1")
        assert not any(a.error for a in make().prepare([kept, gone]).values())
        Checkpoint(tmp_path / "checkpoint.json").save({})
        api.delete(claim_path("ns", "gone"))
        assert make().holders() == {"gpu-0": "claim ns/kept"}
        assert [p.name for p in (tmp_path / "cdi").iterdir()] == ["k8s.gpu.nvidia.com-claim_uid-kept.json"]


def test_bad_checkpoints_set_aside_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    for t in (100, 200, 300, 400):
        (tmp_path / f"checkpoint.json.bad-{t}").write_text("old")
    path.write_text("[")
    assert Checkpoint(path).load() is None
    kept = sorted(p.name for p in tmp_path.glob("checkpoint.json.bad-*"))
    assert len(kept) == 3 and "checkpoint.json.bad-300" in kept and "checkpoint.json.bad-100" not in kept
    assert not path.exists()


def test_a_checkpoint_larger_than_its_reader_takes_is_not_written(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    small = {"u": PreparedClaim("u", "ns", "c", (PreparedDevice(("gpu",), "node-a", "gpu-0", ("k=v",)),))}
    checkpoint.save(small)
    huge = PreparedDevice(("gpu",), "node-a", "gpu-0", ("x" * MAX_CHECKPOINT_BYTES,))
    with pytest.raises(OSError) as refused:
        checkpoint.save({"u": PreparedClaim("u", "ns", "c", (huge,))})
    assert str(refused.value) == (
        f"checkpoint of 1 claims would be {MAX_CHECKPOINT_BYTES + 269} bytes, over the "
        f"{MAX_CHECKPOINT_BYTES} it is read back with; not written"
    )
    assert checkpoint.load() == small


class CountingCheckpoint(Checkpoint):
    """The checkpoint, its writes counted."""

    saves = 0

    def save(self, claims: Any) -> None:
        self.saves += 1
        super().save(claims)


def test_a_calls_claims_cost_one_checkpoint_write(tmp_path: Path) -> None:
    with preparer_on(tmp_path) as (api, make):
        refs = [allocated(api, f"c{n}", f"gpu-{n % 4}") for n in range(40)]
        checkpoint = CountingCheckpoint(tmp_path / "checkpoint.json")
        preparer = make(checkpoint)
        answers = preparer.prepare(refs)
        assert [a.error for a in answers.values()] == [""] * 40 and checkpoint.saves == 1
        assert preparer.unprepare(refs) == {r.uid: "" for r in refs} and checkpoint.saves == 2
        assert json.loads((tmp_path / "checkpoint.json").read_text())["claims"] == {}


def claim_object(name: str, status: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    return {"kind": "ResourceClaim", "metadata": meta, "status": status}


RESULT = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"}
MALFORMED: dict[str, tuple[dict[str, Any] | None, Claim, str]] = {
    "allocation-a-list": (
        claim_object("a", {"allocation": []}),
        Claim("ns", "a", "uid-a"),
        "ResourceClaim ns/a: status.allocation is not a map",
    ),
    "results-a-map": (
        claim_object("b", {"allocation": {"devices": {"results": {"0": RESULT}}}}),
        Claim("ns", "b", "uid-b"),
        "ResourceClaim ns/b: status.allocation.devices.results is not a list",
    ),
    "status-a-list": (
        claim_object("c", []),
        Claim("ns", "c", "uid-c"),
        "ResourceClaim ns/c: status is not a map",
    ),
    "device-a-map": (
        claim_object("d", {"allocation": {"devices": {"results": [RESULT | {"device": {}}]}}}),
        Claim("ns", "d", "uid-d"),
        "ResourceClaim ns/d: an allocation result's device is not a string",
    ),
    "config-requests-a-number": (
        claim_object("e", {"allocation": {"devices": {"results": [RESULT], "config": [{"requests": 1}]}}}),
        Claim("ns", "e", "uid-e"),
        "ResourceClaim ns/e: status.allocation.devices.config[].requests is not a list",
    ),
    "nul-in-uid": (
        None,
        Claim("ns", "f", "uid-\x00f"),
        "ResourceClaim ns/f: UID 'uid-\\x00f' is not letters, digits and '-'",
    ),
    "name-a-path": (
        None,
        Claim("ns", "../g", "uid-g"),
        "ResourceClaim name '../g' (namespace ns) is not a DNS subdomain",
    ),
    "namespace-upper-case": (
        None,
        Claim("NS", "h", "uid-h"),
        "ResourceClaim namespace 'NS' is not a DNS label",
    ),
}


def test_a_malformed_claim_fails_only_itself(tmp_path: Path) -> None:
    """Each malformed claim of one NodePrepareResources call: its one-line error; the good claim of the
    call is prepared; no traceback; NodeUnprepareResources of them: one line each too."""
    with dra_cluster(tmp_path) as cluster:
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        good = make_claim(cluster.api, "good")
        schedule(cluster.api, good)
        refs = []
        for obj, ref, _ in MALFORMED.values():
            if obj is not None:
                cluster.api.put(claim_path("ns", ref.name), obj)
            refs.append(ref)
        answer = cluster.kubelet.node_prepare(DRIVER, [*refs, good]).claims
        assert {ref.uid: answer[ref.uid].error for ref in refs} == {
            ref.uid: error for _, ref, error in MALFORMED.values()
        }
        assert answer[good.uid].devices and not answer[good.uid].error
        unprepared = cluster.kubelet.node_unprepare(DRIVER, [*refs[-3:], good]).claims
        assert [unprepared[r.uid].error for r in refs[-3:]] == [
            f"cannot unprepare: {error}" for _, _, error in list(MALFORMED.values())[-3:]
        ]
        assert not unprepared[good.uid].error
        assert "Traceback" not in process.log()


def test_claim_names_are_one_path_segment(tmp_path: Path) -> None:
    with KubeApiStandin() as api:
        serve_dra(api)
        claims = KubeResourceClaims(new_api_client(host=api.url, retries=0), "v1")
        assert claims.get("ns", "a/../../b") is None
        assert api.requests[-1][1] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a%2F..%2F..%2Fb"


def test_a_claim_whose_api_read_hangs_holds_up_no_other_call(tmp_path: Path) -> None:
    """Two pods' NodePrepareResources at once: the first's claim is read from the API only once the
    second's call was answered (in under 3 s): it waited meanwhile."""
    with dra_cluster(tmp_path) as cluster:
        cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        slow, fast = make_claim(cluster.api, "slow"), make_claim(cluster.api, "fast")
        schedule(cluster.api, slow)
        schedule(cluster.api, fast)
        release = threading.Event()
        cluster.api.held_gets[claim_path("ns", "slow")] = release
        answers: dict[str, Any] = {}
        first = threading.Thread(
            target=lambda: answers.update(slow=cluster.kubelet.node_prepare(DRIVER, [slow])), daemon=True
        )
        first.start()
        wait_until(
            lambda: any(p == claim_path("ns", "slow") for _, p, _ in list(cluster.api.requests)),
            10,
            "the read",
        )
        t0 = time.monotonic()
        try:
            second = cluster.kubelet.node_prepare(DRIVER, [fast])
        except grpc.RpcError as error:
            pytest.fail(f"the second call failed: {error}")
        took = time.monotonic() - t0
        assert not second.claims[fast.uid].error and "slow" not in answers
        assert took < 3.0, f"the second call took {took:.1f} s"
        release.set()
        first.join(15)
        assert not answers["slow"].claims[slow.uid].error
