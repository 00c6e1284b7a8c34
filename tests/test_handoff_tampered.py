"""Hand-over records fail closed: a record of the other API that is removed, emptied, truncated,
replaced by a symlink, grown past 1 MiB, deeply nested, or cleaned away with its directory never lets
this side take a GPU the other side's pod or claim holds; the owner writes its record (and lock)
again once it sees them changed or gone. Two `Handoff`s on one directory behave as two processes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, MAX_RECORD_BYTES, UNKNOWN_HOLDER, Handoff, Record, settle
from nvdp.plugins.handoff import records as handoff
from tests.builders import sim_gpus

A, B = (g.uuid for g in sim_gpus("pcie-4")[:2])
Tamper = Callable[[Path], None]


def remove_file(path: Path) -> None:
    path.unlink()


def empty(path: Path) -> None:
    path.write_text("")


def truncate(path: Path) -> None:
    path.write_text(path.read_text()[:7])


def symlink_to_a_forged_copy(path: Path) -> None:
    forged = path.parent / "forged.json"
    forged.write_text(json.dumps({"serving": [], "holds": {}}))
    link = path.parent / "forged-link.json"
    link.unlink(missing_ok=True)
    link.symlink_to(forged)
    link.replace(path)  # at once: the owner may write its record again between an unlink and a link


def grow(path: Path) -> None:
    path.write_text(json.dumps({"serving": [], "holds": {}, "pad": "x" * MAX_RECORD_BYTES}))


def nest(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def clean_the_directory(path: Path) -> None:
    shutil.rmtree(path.parent)
    path.parent.mkdir()


TAMPERS = [remove_file, empty, truncate, symlink_to_a_forged_copy, grow, nest, clean_the_directory]


def test_an_unknown_record_means_the_other_api_may_hold_any_gpu() -> None:
    settled = settle(frozenset({A, B}), frozenset(), {}, Record(alive=True, known=False))
    assert settled.serve == frozenset() and settled.waiting == {A: UNKNOWN_HOLDER, B: UNKNOWN_HOLDER}
    # what this side serves already stays served
    assert settle(frozenset({A}), frozenset({A}), {}, Record(known=False)).serve == {A}


@pytest.mark.parametrize("holder_api", [DEVICE_PLUGIN, DRA])
@pytest.mark.parametrize("tamper", TAMPERS, ids=[t.__name__ for t in TAMPERS])
def test_a_tampered_record_never_frees_a_held_gpu(tmp_path: Path, holder_api: str, tamper: Tamper) -> None:
    taker_api = DRA if holder_api == DEVICE_PLUGIN else DEVICE_PLUGIN
    holder, taker = Handoff(holder_api, tmp_path), Handoff(taker_api, tmp_path)
    try:
        holder.served(holder.settle(frozenset({A, B}), {B: "pod ml/train"}).serve)
        # the config moves both GPUs to the taker: A is free, B is held by the holder's pod
        assert taker.settle(frozenset({A, B}), {}).waiting == {A: "", B: "pod ml/train"}

        tamper(tmp_path / f"served-by-{holder_api}.json")
        assert B not in taker.settle(frozenset({A, B}), {}).serve  # nothing held is taken
        (misfit, *_) = [m for m in taker.misfits({B: "GPU 1"}) if m.subject == "GPU 1"]
        assert misfit.reason == "GpuHeldByOtherApi"

        assert holder.due()  # the holder sees its files changed or gone ...
        holder.settle(frozenset({A, B}), {B: "pod ml/train"})  # ... and writes them again
        record = json.loads((tmp_path / f"served-by-{holder_api}.json").read_text())
        assert record == {"serving": sorted([A, B]), "holds": {B: "pod ml/train"}}
        assert not (tmp_path / f"served-by-{holder_api}.json").is_symlink()
        assert taker.read_other().alive  # its lock is held again
        assert taker.settle(frozenset({A, B}), {}).waiting == {A: "", B: "pod ml/train"}
    finally:
        holder.close()
        taker.close()


def test_a_directory_cleaned_while_the_other_side_is_stopped_is_unknown_for_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = Handoff(DEVICE_PLUGIN, tmp_path)
    holder.served(holder.settle(frozenset({B}), {B: "pod ml/train"}).serve)
    holder.close()  # stopped: its pod runs on
    taker = Handoff(DRA, tmp_path)
    try:
        assert taker.settle(frozenset({B}), {}).waiting == {B: "pod ml/train"}
        for name in ("served-by-device-plugin.json", "served-by-device-plugin.lock"):
            (tmp_path / name).unlink()
        assert taker.settle(frozenset({B}), {}).waiting == {B: UNKNOWN_HOLDER}
        monkeypatch.setattr(handoff, "LOST_GRACE_S", 0.0)  # nobody wrote them again for that long:
        # its holds are what can be proven (tests/test_handoff_proofs.py), here nothing
        assert taker.settle(frozenset({B}), {}).waiting == {B: UNKNOWN_HOLDER}
    finally:
        taker.close()


def test_a_record_missing_beside_its_lock_file_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "served-by-device-plugin.lock").touch()  # a process took its lock, then its record went
    taker = Handoff(DRA, tmp_path)
    try:
        assert taker.settle(frozenset({B}), {}).waiting == {B: UNKNOWN_HOLDER}
        (tmp_path / "served-by-device-plugin.lock").unlink()  # never seen by this process: none there
        assert taker.settle(frozenset({B}), {}).serve == {B}
    finally:
        taker.close()


def test_a_lock_file_replaced_by_a_symlink_counts_as_held(tmp_path: Path) -> None:
    holder = Handoff(DEVICE_PLUGIN, tmp_path)
    holder.served(holder.settle(frozenset({A}), {}).serve)  # advertises A, no pod holds it
    taker = Handoff(DRA, tmp_path)
    try:
        lock = tmp_path / "served-by-device-plugin.lock"
        lock.unlink()
        lock.symlink_to(tmp_path / "elsewhere")  # would make the holder look stopped
        assert taker.read_other().alive
        assert taker.settle(frozenset({A}), {}).serve == frozenset()  # A stays the holder's
        assert holder.due()
        holder.settle(frozenset({A}), {})  # the holder takes its lock again, on a file of its own
        assert not lock.is_symlink()
    finally:
        holder.close()
        taker.close()
