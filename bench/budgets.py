"""The budgets `python -m bench` checks, and its verdict: which rows missed theirs, a missed ratio
measured once more, and the exit status of `--check`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.table import Row, milliseconds

ALLOCATE_BUDGET = 1.3  # nvdp's Allocate p50 / the floor's, interleaved
STARTUP_BUDGET = 1.3  # nvdp's process start -> first ListAndWatch p50 / the floor's, interleaved
# Not met yet (1.3x-1.5x of the floor's CPU since the cuts of 2026-11-26, 1.5x-2.2x before;
# docs/benchmarks.md): the quick check, which CI runs, holds start-up to this ratio so that it cannot
# grow while the full run keeps showing the miss.
STARTUP_REGRESSION_GUARD = 2.0
PREFERRED_BUDGET = 2.0  # GetPreferredAllocation p50 / Allocate p50 on the same plugin, interleaved
HEALTH_BUDGET_MS = 100.0  # XID -> ListAndWatch, on p99
REREGISTER_BUDGET_MS = 50.0  # kubelet accepting connections -> Register, on max
PLUGIN_RSS_BUDGET_MB = 45.0  # peak RSS of `nvdp plugin`, 45e6 bytes
SIDE_RSS_BUDGET_MB = 80.0  # peak RSS of the side commands
DRA_RSS_MOCK_BUDGET_MB = 60.0  # the DRA plugin on the mock library (NVIDIA's: 58.5 MB)
NVIDIA_START_REGISTER_MS = 26.0  # NVIDIA's spawn -> Register (issue 27, another machine): a reference
# Idle CPU, % of one core: NVIDIA's + 0.05 %. NVIDIA's device plugin v0.20.0 idles at 0.007-0.015 % on
# the condvar mock library (bench.footprint --nvidia-plugin; issue 27's 0.18 % was the old stand-in's
# 5 ms poll); its DRA plugin at 0.0 %. Neither is met yet: one Python gRPC server's compiled-in 200 ms
# poll and gRPC core's threads alone cost ~0.06 % (docs/benchmarks.md). The side commands keep "~0"
# with room for those wake-ups and their own timers.
IDLE_BUDGET_PCT = 0.06
DRA_IDLE_BUDGET_PCT = 0.05
SIDE_IDLE_BUDGET_PCT = 0.5
RESCAN_BUDGET_MS = 3.0  # CPU per minute at the default 10 s interval: "a few ms"
DRA_PREPARE_BUDGET_MS = 20.0  # NodePrepareResources of a one-GPU claim (API read, spec write), p50
DRA_CAPACITY_PREPARE_BUDGET_MS = 50.0  # NodePrepareResources of a capacity share (MPS client edits), p50
DRA_START_BUDGET_MS = 1000.0  # DRA plugin process start -> ResourceSlice published, p50
DRA_LAYOUT_BUDGET_MS = 1000.0  # MIG re-partition -> ResourceSlice republished, max
DRA_MIG_PREPARE_BUDGET_MS = 50.0  # NodePrepareResources of a dynamic MIG claim (MIG device made), p50
# API requests per node (bench/api_cost.py): while idle, per hour (5,000 nodes: 1/h is 1.4 requests/s
# fleet-wide); after one fleet-wide ConfigMap edit, in the 20 s after it; the config-manager's spread.
# A watch is re-opened every 45-90 s (nvdp.kube.reflector: a half-open connection noticed within
# about a minute): at most 3600 / 45 = 80 requests an hour each, no poll. (client-go's 5-10 min,
# with the API server's bookmarks every minute for the silence bound, would be 6-12 an hour.)
_WATCH_PER_HOUR = 3600 / 45
API_IDLE_BUDGET_PER_HOUR = {
    "plugin": 0.0,
    "gfd": 0.0,  # the NodeFeature is written when its labels change, not every 60 s loop
    "config-manager": 2 * _WATCH_PER_HOUR,  # its Node and its ConfigMap
    "dra-kubelet-plugin": _WATCH_PER_HOUR,  # its ResourceSlices
    "mps-control-daemon": 0.0,
}
API_EDIT_REQUESTS_BUDGET = 10
API_SPREAD_MIN_S = 5.0  # 5,000 nodes: at most 1,000 writes in one second


def judge_ratio(row: Row, denominator_ms: float, budget: float) -> Row:
    """Set `row`'s ratio (its p50 over `denominator_ms`), budget and verdict."""
    assert row.p50 is not None
    row.ratio = row.p50 / denominator_ms
    row.budget = f"{budget}x"
    row.ok = row.ratio <= budget
    return row


def remeasured(measure: Callable[[], list[Row]]) -> list[Row]:
    """`measure()`'s rows, or those of a second `measure()` when a ratio in the first missed its
    budget: load on a shared machine moves one measurement's ratio, a regression moves both. The
    second's ratio rows note the first's ratios in their value column."""
    first = measure()
    if not any(r.ratio is not None and r.ok is False for r in first):
        return first
    earlier = {(r.measurement, r.plugin): r.ratio for r in first if r.ratio is not None}
    second = measure()
    for row in second:
        ratio = earlier.get((row.measurement, row.plugin))
        if row.ratio is not None and ratio is not None:
            row.value = "; ".join(v for v in (row.value, f"measured twice, first {ratio:.2f}x") if v)
    return second


def miss_line(row: Row) -> str:
    """One line naming a row that missed its budget, with what was measured."""
    if row.ratio is not None:
        measured = f"ratio {row.ratio:.2f}x"
    elif row.value:
        measured = row.value
    else:
        times = (("p50", row.p50), ("p99", row.p99), ("max", row.max))
        measured = ", ".join(f"{name} {milliseconds(ms)} ms" for name, ms in times if ms is not None)
    return f"{row.measurement} ({row.plugin}): {measured}; budget {row.budget}"


def verdict(rows: Sequence[Row]) -> tuple[int, list[str]]:
    """The exit status of `--check` and the lines that end the report: 0 when at least one budget
    was measured and every one was met, 1 otherwise, each missed budget named on its own line."""
    checked = [r for r in rows if r.ok is not None]
    missed = [r for r in checked if not r.ok]
    if not checked:
        return 1, ["no budget measured"]
    if not missed:
        return 0, [f"every budget met ({len(checked)} checked)"]
    return 1, [f"budgets missed: {len(missed)} of {len(checked)}", *(f"  {miss_line(r)}" for r in missed)]
