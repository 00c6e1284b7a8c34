"""One GPU, one API (`nvdp.plugins.handoff`): the config's `dra.devices`, the rule that settles what each API
serves, and the record protocol between two processes' sides (two `Handoff`s on one directory: flock
locks belong to open files, so two in one process behave as two processes)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from nvdp.base.logs import FIELDS_ATTR
from nvdp.config import parse_text
from nvdp.config.model import DRA_ALL, DRA_NONE
from nvdp.node.gpus.inventory import dra_gpus
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, Handoff, Record, settle
from nvdp.plugins.handoff import records as handoff
from tests.builders import sim_gpus

GPUS = sim_gpus("pcie-4")
A, B, C, D = (g.uuid for g in GPUS)


def test_dra_devices_default_to_none_and_take_all_or_gpus() -> None:
    assert parse_text("version: v1\n").dra.devices == DRA_NONE
    assert parse_text("dra: {devices: all}").dra.devices == DRA_ALL
    assert parse_text(f"dra: {{devices: [3, {B}]}}").dra.devices == ("3", B)
    assert dra_gpus(DRA_NONE, GPUS) == (frozenset(), ())
    assert dra_gpus(DRA_ALL, GPUS) == (frozenset({A, B, C, D}), ())


def test_dra_devices_naming_a_gpu_this_node_lacks_is_a_misfit_and_the_rest_applies() -> None:
    owned, (misfit,) = dra_gpus(("1", "7"), GPUS)
    assert owned == {B}
    assert misfit.reason == "DraDevicesMissing"
    assert misfit.message == "dra.devices: no GPU 7 on this node; left out"


@pytest.mark.parametrize(
    "mine, serving, holds, other, serve, kept, waiting",
    [
        # the config's GPUs, nothing in the way
        ({A, B}, set(), {}, Record(), {A, B}, {}, {}),
        # the other API still advertises B: B waits; once its process stopped, B is free
        ({A, B}, set(), {}, Record(frozenset({B}), alive=True), {A}, {}, {B: ""}),
        ({A, B}, set(), {}, Record(frozenset({B}), alive=False), {A, B}, {}, {}),
        # a pod holds B through the other API: B waits, even while its process is stopped
        ({A, B}, set(), {}, Record(holds={B: "pod ns/p"}), {A}, {}, {B: "pod ns/p"}),
        # the config gives C to the other API: withdrawn, unless a pod holds it here
        ({A}, {A, C}, {}, Record(), {A}, {}, {}),
        ({A}, {A, C}, {C: "claim ns/c"}, Record(), {A, C}, {C: "claim ns/c"}, {}),
        # what is served already stays served (the other side waits on it)
        ({A}, {A}, {}, Record(frozenset({A}), alive=True), {A}, {}, {}),
    ],
)
def test_settle(
    mine: set[str],
    serving: set[str],
    holds: dict[str, str],
    other: Record,
    serve: set[str],
    kept: dict[str, str],
    waiting: dict[str, str],
) -> None:
    settled = settle(frozenset(mine), frozenset(serving), holds, other)
    assert (settled.serve, dict(settled.kept), dict(settled.waiting)) == (serve, kept, waiting)


def record(directory: Path, api: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((directory / f"served-by-{api}.json").read_text())
    return loaded


def test_a_gpu_moves_only_once_the_other_side_withdrew_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin, dra = Handoff(DEVICE_PLUGIN, tmp_path), Handoff(DRA, tmp_path)
    try:
        plugin.served(plugin.settle(frozenset({A, B}), {}).serve)  # the old config: all the plugin's
        assert record(tmp_path, DEVICE_PLUGIN) == {"serving": sorted([A, B]), "holds": {}}
        # the DRA driver read the new config first: B waits for the plugin
        assert dra.settle(frozenset({B}), {}).serve == frozenset()
        assert dra.misfits({B: "GPU 1"}) == ()  # the plugin is reading the same switch: not yet said
        monkeypatch.setattr(handoff, "SWITCH_GRACE_S", 0.0)  # ... until it has not withdrawn B for long
        (misfit,) = dra.misfits({B: "GPU 1"})
        assert misfit.reason == "GpuHeldByOtherApi"
        assert misfit.message == (
            f"GPU 1 ({B}): the config gives it to the DRA driver, but the device plugin still advertises it;"
            " served here once it is free"
        )
        assert dra.retry_in() is not None
        dra.served(frozenset())
        # the plugin reads it too: B is withdrawn and the record says so; the DRA driver sees the change
        plugin.served(plugin.settle(frozenset({A}), {}).serve)
        assert dra.due()
        assert dra.settle(frozenset({B}), {}).serve == {B}
        assert dra.misfits({}) == ()
        assert dra.retry_in() is None
        assert record(tmp_path, DRA)["serving"] == [B]  # named before it is advertised
    finally:
        plugin.close()
        dra.close()


def test_a_gpu_a_pod_holds_stays_until_released(tmp_path: Path) -> None:
    plugin, dra = Handoff(DEVICE_PLUGIN, tmp_path), Handoff(DRA, tmp_path)
    try:
        plugin.served(plugin.settle(frozenset({A, B}), {}).serve)
        settled = plugin.settle(frozenset({A}), {B: "pod ml/train"})  # B moves to DRA; a pod holds it
        assert settled.serve == {A, B}
        (misfit,) = plugin.misfits({B: "GPU 1"})
        assert (misfit.reason, misfit.subject) == ("GpuHandoverDeferred", "GPU 1")
        said = "pod ml/train holds it through the device plugin; kept here until it is released"
        assert said in misfit.message
        plugin.served(settled.serve)
        assert dra.settle(frozenset({B}), {}).waiting == {B: "pod ml/train"}
        plugin.served(plugin.settle(frozenset({A}), {}).serve)  # the pod ended
        assert dra.settle(frozenset({B}), {}).serve == {B}
    finally:
        plugin.close()
        dra.close()


def test_a_record_removed_the_moment_it_was_written_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removed between its rename and any look at it (a cleaning script, a tamper): the side knows
    the file it wrote by the write itself, so it sees it gone and writes it again."""
    plugin = Handoff(DEVICE_PLUGIN, tmp_path)
    record = tmp_path / "served-by-device-plugin.json"
    write = handoff.write_atomic

    def write_then_removed(path: Path, content: bytes, mode: int) -> os.stat_result:
        written = write(path, content, mode)
        path.unlink()
        return written

    try:
        plugin.settle(frozenset({A}), {B: "pod ml/train"})
        monkeypatch.setattr(handoff, "write_atomic", write_then_removed)
        plugin.served(frozenset({A, B}))  # a new record, removed at once
        monkeypatch.undo()
        assert not record.exists() and plugin.due()
        plugin.settle(frozenset({A}), {B: "pod ml/train"})
        assert json.loads(record.read_text())["holds"] == {B: "pod ml/train"}
    finally:
        plugin.close()


def test_a_stopped_process_frees_what_it_advertised_but_not_what_its_pods_hold(tmp_path: Path) -> None:
    plugin = Handoff(DEVICE_PLUGIN, tmp_path)
    plugin.settle(frozenset({A, B}), {B: "pod ns/p"})
    plugin.served(frozenset({A, B}))
    plugin.close()  # the process ended without a word: its lock is free
    dra = Handoff(DRA, tmp_path)
    try:
        assert dra.read_other() == Record(frozenset({A, B}), {B: "pod ns/p"}, alive=False)
        assert dra.settle(frozenset({A, B}), {}).serve == {A}
        # the plugin runs again: until its ledger answers, the last run's holds stand
        again = Handoff(DEVICE_PLUGIN, tmp_path)
        again.settle(frozenset({C}), None)
        again.served(frozenset({C}))
        assert record(tmp_path, DEVICE_PLUGIN)["holds"] == {B: "pod ns/p"}
        again.settle(frozenset({C}), {})
        again.served(frozenset({C}))
        assert dra.due()
        assert dra.settle(frozenset({A, B}), {}).serve == {A, B}
        again.close()
    finally:
        dra.close()


def test_a_side_that_stops_writes_what_it_holds_then(tmp_path: Path) -> None:
    """The DRA plugin's stop writes its holds as they are once no request can come in: a claim
    unprepared since its last settle is not left named (an uninstall would keep the record for it)."""
    dra = Handoff(DRA, tmp_path)
    try:
        dra.served(dra.settle(frozenset({A}), {A: "claim ns/c"}).serve)
        assert record(tmp_path, DRA)["holds"] == {A: "claim ns/c"}
        dra.hold({})
        assert record(tmp_path, DRA) == {"serving": [A], "holds": {}}
    finally:
        dra.close()


def test_two_sides_taking_one_gpu_at_once_both_back_off(tmp_path: Path) -> None:
    """A stale config on one side: both want B and neither serves it. Each names B, then looks at the
    other's record again: the two looks cross, so both see the other's claim and both back off (and
    try again at a random moment), never both serving B."""
    plugin, dra = Handoff(DEVICE_PLUGIN, tmp_path), Handoff(DRA, tmp_path)
    try:
        dra.settle(frozenset(), {})  # the DRA driver runs (holds its lock)
        first_look = plugin.read_other

        def crossing() -> Record:
            seen = first_look()  # the plugin's first look finds nothing; then the DRA driver names B
            (tmp_path / "served-by-dra.json").write_text(json.dumps({"serving": [B], "holds": {}}))
            plugin.read_other = first_look  # type: ignore[method-assign]
            return seen

        plugin.read_other = crossing  # type: ignore[method-assign]
        settled = plugin.settle(frozenset({B}), {})
        assert settled.serve == frozenset() and settled.waiting == {B: ""}
        assert plugin.retry_in() is not None
        plugin.served(settled.serve)
        assert record(tmp_path, DEVICE_PLUGIN)["serving"] == []
        assert dra.settle(frozenset({B}), {}).serve == {B}  # the DRA driver's own look: B is free now
    finally:
        plugin.close()
        dra.close()


def test_a_directory_that_cannot_be_made_again_changes_nothing_served(tmp_path: Path) -> None:
    """The DRA directory removed (a kubelet reinstall) and something else at its path: once the DRA
    driver's record was seen, the device plugin neither takes the GPUs the config gives it nor drops
    what it serves until the directory is usable again (it used to take every GPU of its config)."""
    directory = tmp_path / "gpu.nvidia.com"
    plugin, dra = Handoff(DEVICE_PLUGIN, directory), Handoff(DRA, directory)
    try:
        dra.served(dra.settle(frozenset({C}), {C: "claim ns/c1"}).serve)
        plugin.served(plugin.settle(frozenset({A, C}), {}).serve)
        assert plugin.settle(frozenset({A, C}), {}).serve == {A}  # C: the claim holds it through DRA
        shutil.rmtree(directory)
        directory.write_text("")  # a file where the directory was: it cannot be made again
        assert plugin.settle(frozenset({A, B, C}), {}).serve == {A}
        directory.unlink()
        assert plugin.settle(frozenset({A, B, C}), {}).serve == {A}  # made again: DRA's record unknown
    finally:
        plugin.close()
        dra.close()


def test_no_records_without_the_dra_directory_and_a_lock_held_elsewhere_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    absent = Handoff(DEVICE_PLUGIN, tmp_path / "plugins" / "gpu.nvidia.com")  # no plugins dir: no DRA here
    assert absent.settle(frozenset({A}), {}).serve == {A}
    absent.served(frozenset({A}))
    assert not (tmp_path / "plugins").exists()
    (tmp_path / "plugins").mkdir()  # the DRA directory's parent appears: the plugin takes part
    absent.served(absent.settle(frozenset({A}), {}).serve)
    assert record(tmp_path / "plugins" / "gpu.nvidia.com", DEVICE_PLUGIN)["serving"] == [A]
    absent.close()

    fd = os.open(tmp_path / "served-by-dra.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another DRA process runs
    try:
        second = Handoff(DRA, tmp_path)
        second.settle(frozenset(), {})
        (said,) = [r for r in caplog.records if "not locked" in r.getMessage()]
        assert said.levelname == "WARNING"
        assert said.__dict__[FIELDS_ATTR]["problem"] == "another process of the DRA driver holds the lock"
        second.close()
    finally:
        os.close(fd)
