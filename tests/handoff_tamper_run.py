"""Hand-over records tampered with under both real processes (`nvdp plugin` with the kubelet stand-in,
`nvdp dra-kubelet-plugin` with the API stand-in), a pod holding a GPU through the device plugin and a
claim holding one through DRA while the config gives each to the other API: per tamper and holder,
`--runs` runs, the held GPUs the other API advertised (sampled every 5 ms for `--window-seconds`,
and in the whole history of the kubelet's ListAndWatch updates and the ResourceSlice writes: must be
0), and the time until the holder's record said its hold again.

A measurement over the tests' two-API node, so it lives with them (not part of `python -m bench`):
`python -m tests.handoff_tamper_run [--runs N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from tests.handoff_tamper_node import HOLDERS, TAMPERS, crossed_node

COLUMNS = ("holder", "tamper", "runs", "both sampled", "both history", "rewritten p50 ms", "max ms")


def run_tampers() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.handoff_tamper_run", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window-seconds", type=float, default=1.0)
    args = parser.parse_args()
    started = time.monotonic()
    rows: list[tuple[str, ...]] = []
    seen = 0  # moments of the node's history both APIs advertised a held GPU, so far
    with (
        tempfile.TemporaryDirectory(prefix="nvdp-handoff-tamper-", dir="/tmp") as work,
        crossed_node(Path(work)) as node,
    ):
        for holder in HOLDERS:
            for tamper in TAMPERS:
                both = history = 0
                rewritten: list[float] = []
                for _ in range(args.runs):
                    outcome = node.tamper(holder, tamper, args.window_seconds)
                    both += len(outcome.both)
                    history += len(outcome.overlapping) - seen
                    seen = len(outcome.overlapping)
                    if outcome.rewritten_s is not None:
                        rewritten.append(outcome.rewritten_s * 1000)
                    node.steady()
                missing = args.runs - len(rewritten)
                rows.append(
                    (
                        holder,
                        tamper.__name__,
                        str(args.runs),
                        str(both),
                        str(history),
                        f"{statistics.median(rewritten):.0f}" if rewritten else "-",
                        f"{max(rewritten):.0f}" + (f" ({missing} never)" if missing else ""),
                    )
                )
                print(" | ".join(rows[-1]), flush=True)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    print()
    print("| " + " | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\n{len(rows) * args.runs} tampers in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run_tampers()
