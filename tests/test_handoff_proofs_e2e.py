"""A stopped side's holds, proven once its record and lock were cleaned away, on one node with both
real processes (tests/handoff_tamper_node.py): a pod holds a GPU through the device plugin, a claim
one through DRA, and the config gives each to the other API.

- The DRA side's proof, the kubelet stand-in's PodResources naming the real device plugin's pod:
  shown with `Handoff`s in this process (the grace shortened), beside the node's own records.
- The device plugin's proof, the real DRA driver's checkpoint: the DRA driver stopped, its record and
  lock removed, the real device plugin waits out its grace (LOST_GRACE_S, 30 s in production, 2 s
  here: `nvdp.base.timers`) and still never advertises the claim's GPU; once the directory is cleaned (the
  checkpoint gone too) it stays unknown, said once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdp.base.timers import as_env
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, Handoff
from nvdp.plugins.handoff import records as handoff
from testkit import wait_until
from tests.builders import sim_gpus
from tests.handoff_tamper_node import CrossedNode, crossed_node, remove_the_directory
from tests.test_one_gpu_one_api_e2e import UUIDS

GPUS = sim_gpus("pcie-4")
UNPROVEN = "GPU hand-over record gone with its lock and the other API's holds cannot be proven"
LOST_GRACE_S, RETRY_S = 2.0, 0.2  # the processes' (production: 30 s, 5 s)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[CrossedNode]:
    timers = as_env(handoff_lost_grace=LOST_GRACE_S, handoff_retry=RETRY_S)
    with crossed_node(tmp_path, timers) as crossed:
        yield crossed


def remove_record_and_lock(path: Path) -> None:
    path.unlink()
    path.with_suffix(".lock").unlink()


@pytest.mark.soak
def test_a_stopped_sides_holds_are_proven_once_its_records_are_cleaned_away(
    node: CrossedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The DRA side: the device plugin's pod, from the kubelet's PodResources (the grace cut short).
    beside = node.directory.parent / "proof-check"  # its kubelet root is the node's
    beside.mkdir()
    holder, taker = Handoff(DEVICE_PLUGIN, beside), Handoff(DRA, beside)
    try:
        holder.served(holder.settle(frozenset(UUIDS), {}, GPUS).serve)
        holder.close()
        taker.settle(frozenset(UUIDS), {}, GPUS)
        remove_record_and_lock(beside / "served-by-device-plugin.json")
        monkeypatch.setattr(handoff, "LOST_GRACE_S", 0.0)
        assert taker.settle(frozenset(UUIDS), {}, GPUS).waiting == {node.by_pod: "pod ml/train"}
    finally:
        taker.close()
    monkeypatch.undo()

    # The device plugin's side: the real DRA driver stopped, its record and lock removed.
    node.node.dra.stop()
    assert (node.directory / "checkpoint.json").is_file()
    outcome = node.tamper(DRA, remove_record_and_lock, LOST_GRACE_S + 2 * RETRY_S, rewrite_s=0)
    assert outcome.both == frozenset() and outcome.overlapping == []
    assert node.by_claim not in node.node.by_plugin()
    assert UNPROVEN not in node.node.plugin.log()

    # The whole directory cleaned: the checkpoint is gone, nothing proves the claim; it stays unknown.
    outcome = node.tamper(DRA, remove_the_directory, 2 * RETRY_S, rewrite_s=0)
    assert outcome.both == frozenset() and outcome.overlapping == []
    wait_until(lambda: UNPROVEN in node.node.plugin.log(), 10, "the device plugin saying so")
    assert node.node.plugin.log().count(UNPROVEN) == 1
