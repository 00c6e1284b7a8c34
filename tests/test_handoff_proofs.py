"""A stopped side whose record and lock were cleaned away past LOST_GRACE_S: its holds are what the
other side can prove (the DRA driver: the kubelet's PodResources; the device plugin: the DRA
checkpoint), else it stays unknown (one WARNING). Two `Handoff`s on one directory behave as two
processes; the PodResources API is a real gRPC server on a unix socket."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdp.api.podresources import podresources_grpc, podresources_pb
from nvdp.base.logs import FIELDS_ATTR
from nvdp.plugins.dra.checkpoint import dra_holds
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, UNKNOWN_HOLDER, Handoff
from nvdp.plugins.handoff import records as handoff
from tests.builders import sim_gpus

GPUS = sim_gpus("pcie-4")
A, B = GPUS[0].uuid, GPUS[1].uuid
UNPROVEN = "GPU hand-over record gone with its lock and the other API's holds cannot be proven"


class _HeldLister(podresources_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, held: Sequence[tuple[str, str, str]]) -> None:
        self.held = held  # (resource, device ID, pod name in namespace ml)

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802
        answer = podresources_pb.ListPodResourcesResponse()
        for resource, device_id, name in self.held:
            pod = answer.pod_resources.add(namespace="ml", name=name)
            pod.containers.add(name="main").devices.add(resource_name=resource, device_ids=[device_id])
        return answer


@pytest.fixture
def records(sock_dir: Path) -> Path:
    """The DRA driver's directory, its kubelet root `sock_dir` (a short path: sockets)."""
    directory = sock_dir / "plugins" / "gpu.nvidia.com"
    directory.mkdir(parents=True)
    return directory


def serve_pod_resources(kubelet_root: Path, held: Sequence[tuple[str, str, str]]) -> grpc.Server:
    (kubelet_root / "pod-resources").mkdir()
    server = grpc.server(ThreadPoolExecutor(2))
    podresources_grpc.add_PodResourcesListerServicer_to_server(_HeldLister(held), server)
    server.add_insecure_port(f"unix:{kubelet_root / 'pod-resources' / 'kubelet.sock'}")
    server.start()
    return server


def stopped_and_cleaned(directory: Path, api: str, holds: dict[str, str], taker: Handoff) -> None:
    """`api`'s process holds `holds`, is seen by `taker`, stops; its record and lock are removed."""
    holder = Handoff(api, directory)
    holder.served(holder.settle(frozenset(holds), holds, GPUS).serve)
    holder.close()
    assert taker.settle(frozenset({A, B}), {}, GPUS).waiting == holds  # seen: the record says
    for suffix in ("json", "lock"):
        (directory / f"served-by-{api}.{suffix}").unlink()


@pytest.fixture
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "LOST_GRACE_S", 0.0)


def test_the_dra_driver_proves_the_device_plugins_holds_from_pod_resources(
    records: Path, sock_dir: Path, no_grace: None
) -> None:
    held = [("nvidia.com/gpu", f"{B}::2", "train"), ("nvidia.com/hostdev", "0000:3b:00.1", "net")]
    server = serve_pod_resources(sock_dir, held)  # a replica of B; a device of another plugin
    taker = Handoff(DRA, records)
    try:
        stopped_and_cleaned(records, DEVICE_PLUGIN, {B: "pod ml/old"}, taker)
        settled = taker.settle(frozenset({A, B}), {}, GPUS)
        assert (settled.serve, settled.waiting) == ({A}, {B: "pod ml/train"})
    finally:
        taker.close()
        server.stop(None)


def test_without_pod_resources_the_stopped_device_plugin_stays_unknown(
    records: Path, no_grace: None, caplog: pytest.LogCaptureFixture
) -> None:
    taker = Handoff(DRA, records)
    try:
        stopped_and_cleaned(records, DEVICE_PLUGIN, {B: "pod ml/train"}, taker)
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert taker.settle(frozenset({A, B}), {}, GPUS).waiting == {
                    A: UNKNOWN_HOLDER,
                    B: UNKNOWN_HOLDER,
                }
        (said,) = [r for r in caplog.records if UNPROVEN in r.getMessage()]
        socket = records.parent.parent / "pod-resources" / "kubelet.sock"
        assert said.__dict__[FIELDS_ATTR]["error"] == f"no PodResources socket at {socket}"
    finally:
        taker.close()


def checkpoint(directory: Path, *device_names: str) -> None:
    devices = [
        {"request_names": ["gpu"], "pool_name": "node-a", "device_name": n, "cdi_device_ids": []}
        for n in device_names
    ]
    claims = {"uid-c1": {"namespace": "ns", "name": "c1", "devices": devices}}
    (directory / "checkpoint.json").write_text(json.dumps({"version": "nvdp/v1", "claims": claims}))


def test_the_device_plugin_proves_the_dra_drivers_holds_from_its_checkpoint(
    records: Path, no_grace: None
) -> None:
    taker = Handoff(DEVICE_PLUGIN, records, prove=dra_holds)
    try:
        checkpoint(records, f"gpu-{GPUS[1].minor}")
        stopped_and_cleaned(records, DRA, {B: "claim ns/c1"}, taker)
        settled = taker.settle(frozenset({A, B}), {}, GPUS)
        assert (settled.serve, settled.waiting) == ({A}, {B: "claim ns/c1"})
    finally:
        taker.close()


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "No such file or directory"),
        ("{", "Expecting property name"),
        (
            '{"version": "nvdp/v1", "claims": {"u": {"devices": [{"device_name": "gpu-9"}]}}}',
            "device gpu-9 names no GPU of this node",
        ),
    ],
    ids=["missing", "truncated", "no-such-gpu"],
)
def test_without_a_readable_checkpoint_the_stopped_dra_driver_stays_unknown(
    records: Path, no_grace: None, caplog: pytest.LogCaptureFixture, content: str | None, error: str
) -> None:
    taker = Handoff(DEVICE_PLUGIN, records, prove=dra_holds)
    try:
        if content is not None:
            (records / "checkpoint.json").write_text(content)
        stopped_and_cleaned(records, DRA, {B: "claim ns/c1"}, taker)
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert taker.settle(frozenset({A, B}), {}, GPUS).serve == frozenset()
        (said,) = [r for r in caplog.records if UNPROVEN in r.getMessage()]
        assert said.__dict__[FIELDS_ATTR]["error"].startswith(f"{records / 'checkpoint.json'}: {error}")
    finally:
        taker.close()


def test_a_mig_device_of_the_checkpoint_names_its_gpu(records: Path) -> None:
    gpu = GPUS[2]
    checkpoint(records, f"gpu-{gpu.minor}-mig-1g5gb-19-0")
    assert dra_holds(records, GPUS) == {gpu.uuid: "claim ns/c1"}


def test_a_never_seen_record_needs_no_proof(records: Path) -> None:
    """A side this process never saw (not deployed) is none: nothing to prove, nothing read."""
    taker = Handoff(DRA, records)
    try:
        assert taker.settle(frozenset({A, B}), {}, GPUS).serve == {A, B}
    finally:
        taker.close()
