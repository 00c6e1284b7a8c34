"""Timing calls: latencies from concurrent callers, and plugins measured in alternating rounds so that
the ratio of two plugins' numbers compares the same minutes of a shared machine."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.table import Row

WARMUP_CALLS = 200


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass
class Sample:
    """Latencies (seconds) of calls and the wall time they took together."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0

    def add(self, other: Sample) -> None:
        self.latencies += other.latencies
        self.wall += other.wall

    def p50_ms(self) -> float:
        return 1e3 * statistics.median(self.latencies)

    def row(self, measurement: str, plugin: str, *, rate: bool = True, **kw: Any) -> Row:
        s = sorted(self.latencies)
        return Row(
            measurement,
            plugin,
            str(len(s)),
            1e3 * statistics.median(s),
            1e3 * percentile(s, 0.99),
            1e3 * s[-1],
            len(s) / self.wall if rate and self.wall else None,
            **kw,
        )


def run_calls(call: Callable[[int], object], calls: int, concurrency: int) -> Sample:
    """`call(i)` for i in range(calls), from `concurrency` threads; per-call latency and the wall time."""
    per_thread = [list(range(t, calls, concurrency)) for t in range(concurrency)]
    results: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    start = threading.Barrier(concurrency + 1)

    def worker(t: int) -> None:
        out = results[t]
        start.wait()
        try:
            for i in per_thread[t]:
                t0 = time.perf_counter()
                call(i)
                out.append(time.perf_counter() - t0)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a benchmarked call failed: {errors[0]!r}") from errors[0]
    return Sample([x for r in results for x in r], wall)


def interleaved(
    calls: dict[str, Callable[[int], object]], total: int, concurrency: int, rounds: int
) -> dict[str, Sample]:
    """Every plugin gets `total` calls, split into `rounds` rounds that alternate between plugins
    (A B, B A, A B, ...), after a warm-up of each (connections, code paths, thread pools)."""
    samples = {name: Sample() for name in calls}
    for call in calls.values():
        run_calls(call, WARMUP_CALLS, concurrency)
    per_round = max(1, total // rounds)
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name].add(run_calls(calls[name], per_round, concurrency))
    return samples
