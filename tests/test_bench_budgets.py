"""The benchmarks' verdict (bench/budgets.py): which budgets were missed, a missed ratio measured once
more, and the exit status of `python -m bench --check` (the one test that imports bench: its
subject is the benchmarks' own logic, which `.ci/run` relies on)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.budgets import judge_ratio, remeasured, verdict
from bench.table import Row
from testkit import REPO, clean_env


def allocate(ratio: float | None, ok: bool | None = None, *, case: str = "Allocate, 8 GPUs, c=1") -> Row:
    return Row(case, "nvdp", "1000", p50=0.5, ratio=ratio, budget="1.3x" if ok is not None else "", ok=ok)


RSS_MISS = Row("plugin process, 64 GPUs", "nvdp", value="46.1 MB (44.0 MiB)", budget="45 MB", ok=False)
HEALTH_MISS = Row("XID -> ListAndWatch", "nvdp", "64", 15.2, 120.0, 130.5, budget="100 ms p99", ok=False)


@pytest.mark.parametrize(
    ("rows", "status", "lines"),
    [
        ([], 1, ["no budget measured"]),
        ([allocate(None), Row("floor process", "floor", value="42 MB")], 1, ["no budget measured"]),
        ([allocate(1.02, True), allocate(0.99, True)], 0, ["every budget met (2 checked)"]),
        (
            [allocate(None), allocate(1.49, False), allocate(1.1, True)],
            1,
            ["budgets missed: 1 of 2", "  Allocate, 8 GPUs, c=1 (nvdp): ratio 1.49x; budget 1.3x"],
        ),
        (
            [RSS_MISS, HEALTH_MISS, allocate(1.0, True)],
            1,
            [
                "budgets missed: 2 of 3",
                "  plugin process, 64 GPUs (nvdp): 46.1 MB (44.0 MiB); budget 45 MB",
                "  XID -> ListAndWatch (nvdp): p50 15.2 ms, p99 120.0 ms, max 130.5 ms; budget 100 ms p99",
            ],
        ),
    ],
    ids=["nothing", "no budget", "all met", "a ratio missed", "a size and a latency missed"],
)
def test_verdict_names_every_missed_budget_and_fails_when_none_was_checked(
    rows: list[Row], status: int, lines: list[str]
) -> None:
    assert verdict(rows) == (status, lines)


@pytest.mark.parametrize(
    ("p50", "budget", "ok"), [(0.65, 1.3, True), (0.651, 1.3, False), (0.3, 1.3, True), (1.0, 2.0, True)]
)
def test_a_ratio_is_judged_on_p50_over_the_denominator_at_most_the_budget(
    p50: float, budget: float, ok: bool
) -> None:
    row = judge_ratio(Row("Allocate", "nvdp", p50=p50), 0.5, budget)
    assert row.ratio == pytest.approx(p50 / 0.5)
    assert (row.budget, row.ok) == (f"{budget}x", ok)


@pytest.mark.parametrize(
    ("measured", "calls", "final_ok", "note"),
    [
        ([(1.1, True)], 1, True, ""),
        ([(1.49, False), (1.05, True)], 2, True, "measured twice, first 1.49x"),
        ([(1.49, False), (1.41, False)], 2, False, "measured twice, first 1.49x"),
    ],
    ids=["met at once", "missed, then met", "missed twice"],
)
def test_a_missed_ratio_is_measured_once_more_and_the_second_is_judged(
    measured: list[tuple[float, bool]], calls: int, final_ok: bool, note: str
) -> None:
    results = iter(measured)
    made: list[list[Row]] = []

    def measure() -> list[Row]:
        ratio, ok = next(results)
        made.append([Row("Allocate, c=1", "floor", p50=0.5), allocate(ratio, ok, case="Allocate, c=1")])
        return made[-1]

    rows = remeasured(measure)
    assert len(made) == calls
    assert rows is made[-1]
    assert (rows[1].ok, rows[1].value) == (final_ok, note)
    assert rows[0].value == ""  # the floor's row carries no ratio


def test_only_ratios_are_measured_again() -> None:
    made: list[list[Row]] = []

    def measure() -> list[Row]:
        made.append([dataclasses.replace(RSS_MISS)])
        return made[-1]

    assert remeasured(measure)[0].ok is False
    assert len(made) == 1


def _bench_check(report: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bench", "--show", str(report), "--check"]
    return subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)


def _report(path: Path, *rows: Row) -> Path:
    sections = [["Allocate", [dataclasses.asdict(r) for r in rows]]]
    path.write_text(json.dumps({"header": ["machine: test"], "sections": sections}))
    return path


def test_check_exits_1_naming_the_missed_budget_and_0_when_every_budget_is_met(tmp_path: Path) -> None:
    missed = _bench_check(_report(tmp_path / "missed.json", allocate(1.0, True), allocate(1.49, False)))
    assert missed.returncode == 1, missed.stderr
    assert missed.stdout.splitlines()[-2:] == [
        "budgets missed: 1 of 2",
        "  Allocate, 8 GPUs, c=1 (nvdp): ratio 1.49x; budget 1.3x",
    ]
    met = _bench_check(_report(tmp_path / "met.json", allocate(1.0, True)))
    assert (met.returncode, met.stdout.splitlines()[-1]) == (0, "every budget met (1 checked)"), met.stderr


def test_api_cost_counts_each_open_watch_by_its_timeout_and_other_requests_at_their_rate() -> None:
    """bench/api_cost.py: a watch re-opened every `timeoutSeconds` costs 3600 / it an hour; a GET that
    is no watch in the idle window is a poll (a watch could have answered it)."""
    from bench.api_cost import Command, _open_watches

    watch = {"watch": "true", "fieldSelector": "metadata.name=node-a"}
    requests = [
        ("GET", "/api/v1/nodes", {"fieldSelector": "metadata.name=node-a"}),  # the list at start
        ("GET", "/api/v1/nodes", {**watch, "timeoutSeconds": "60"}),
        ("GET", "/api/v1/nodes", {**watch, "timeoutSeconds": "90"}),  # the same stream, opened again
        ("GET", "/apis/resource.k8s.io/v1/resourceslices", {"watch": "true"}),  # no timeout: 1800 s
    ]
    assert _open_watches(requests) == {
        ("/api/v1/nodes", "metadata.name=node-a"): 90.0,
        ("/apis/resource.k8s.io/v1/resourceslices", ""): 1800.0,
    }
    command = Command("config-manager", None, None, idle_s=60.0)  # type: ignore[arg-type]
    command.watches = _open_watches(requests)
    command.idle = [requests[2], ("POST", "/api/v1/namespaces/default/events", {})]
    assert command.per_hour() == pytest.approx(60 + 3600 / 90 + 3600 / 1800)
    assert command.polls() == 0
    command.idle.append(("GET", "/api/v1/nodes/node-a", {}))
    assert command.polls() == 1
