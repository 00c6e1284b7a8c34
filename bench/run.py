"""nvdp benchmarks: one command, one table. `python -m bench` (or `python bench/run.py`).

The default runs every measurement, in a few minutes on 2 cores (60 s of it idle). `--quick` runs
the budget check's part in under a minute: Allocate at concurrency 1 against the floor, the plugin's
peak RSS after the Allocate load, process start against the floor (docs/benchmarks.md says what and
why). `--check` exits 1 when a budget it measured was missed (or none was measured), each one named at
the end; `.ci/run` runs `--quick --check`. A ratio that misses its budget is measured once more and
the second measurement is the one judged (its row notes the first ratio).
`--markdown` prints the table for the README; `--save FILE` keeps the results and `--show FILE
[--markdown]` prints them again, e.g. in the other format.

Measured in one run, side by side, with `nvdp plugin` (simulated NVML) as a real process and the bare
grpcio floor plugin (bench/floor.py, run by bench/floor_serve.py) as a process too, so both pay the same
process boundary; the client is the kubelet stand-in's channel in this process:

- Allocate round trips, p50/p99/max and calls/s at concurrency 1 and 8, for 8 GPUs (dgx-a100), a
  64-GPU simulated node and 512 time-slicing replicas (the last with /metrics off and on), each run
  interleaved with the floor answering the same requests; ratio = nvdp p50 / floor p50 (budget 1.3x).
- GetPreferredAllocation over the 512 replicas (a quarter of them taken), sizes 1, 2, 4, 8; ratio =
  its p50 / nvdp's Allocate p50 on the same plugin, those Allocate calls interleaved with them
  (budget 2x). The floor answering the same requests shows what the transport of a 384-ID request
  costs.
- Peak RSS (VmHWM) of each plugin process after its load (budget 45 MB = 45e6 bytes).
- A simulated XID (a line appended to $NVDP_SIM_EVENTS) until the kubelet stand-in receives the
  ListAndWatch update (budget 100 ms, on p99). The simulated node's file follower polls every 20 ms.
- Kubelet restart until Register arrives: from the moment the kubelet accepts connections (budget
  50 ms, on max) and from the start of the restart; plain, and with kubelet.sock refusing
  connections for a while first (the worst case).
- Process start until Register and until the first ListAndWatch response, and the CPU the process
  used until then, nvdp's and the floor's starts alternating; ratio = nvdp's CPU p50 / the floor's
  (budget 1.3x; CPU, as wall time on a loaded machine is mostly the scheduler's).
- CPU time and context switches (wake-ups) of idle plugin processes over --idle-seconds, with the
  default 10 s device rescan and with it off.
- The in-process allocation tables of bench/allocation.py, when it is there.
- The device rescan's CPU per tick and per minute while nothing changes (bench/rescan.py, in process).
- Peak RSS, heavy imports (kubernetes, ssl, http.client) and idle CPU of the plugin with a CDI
  strategy and with an MPS config, of mps-control-daemon, gfd (labels file; NodeFeature API) and
  config-manager (bench/commands.py; budgets 45 MB for the plugin, 80 MB for side commands).
- The footprint beside NVIDIA's binaries (bench/footprint.py; full run): peak RSS and idle CPU of the
  plugin and the DRA plugin on the C NVML stand-in (the mock library) and on the simulated node, with
  issue 27's NVIDIA numbers; spawn -> Register also as a multiple of NVIDIA's 26 ms.
- API requests per node per hour of every command while idle, and for one fleet-wide ConfigMap
  edit, each against an API stand-in of its own (bench/api_cost.py; full run, with the side commands).
- The DRA kubelet plugin (bench/dra.py, also in --quick): start until its ResourceSlice is published
  (1 s), a MIG re-partition until it is republished (1 s, max), NodePrepareResources of a one-GPU
  claim (20 ms, p50), of a share of a GPU shared by capacity (50 ms, p50; bench/dra_capacity.py), its
  peak RSS (80 MB) and, in the full run, its idle CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # grpc core's INFO lines (GOAWAY...) are not results

from bench.api_cost import section as api_cost_section
from bench.budgets import verdict
from bench.dra import section as dra_section
from bench.footprint import section as footprint_section
from bench.harness import compile_bytecode, machine_lines
from bench.idle import commands_table, idle
from bench.in_process import allocation_tables, rescan_table
from bench.lifecycle import health, restarts, start_up
from bench.rpc import rpc_sections
from bench.session import Options, Session
from bench.table import Row, Table


def measure(s: Session) -> Table:
    """Every section the options ask for, into the session's table."""
    rpc_sections(s)
    if not s.o.quick:
        health(s)
        restarts(s)
    start_up(s)
    dra_section(s)
    if s.o.quick:
        return s.table
    idle(s)
    if s.o.allocation_rows:
        allocation_tables(s)
    rescan_table(s)
    if s.o.commands:
        commands_table(s)
        api_cost_section(s)
    footprint_section(s)
    return s.table


def options(args: argparse.Namespace) -> Options:
    """--quick times fewer calls in more, shorter rounds, and fewer starts; it leaves out the sections
    that use the rest."""
    quick = bool(args.quick)
    return Options(
        quick=quick,
        idle_seconds=60.0 if args.idle_seconds is None else args.idle_seconds,
        calls=1000 if quick else 4000,
        rounds=10 if quick else 8,
        preferred_calls=1000,
        health_events=64,
        restarts=20,
        starts=10 if quick else 20,
        allocation_rows=not args.no_allocation_tables,
        commands=not args.no_commands,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the budget check's part: Allocate c=1, RSS, start-up (under a minute)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a measured budget was missed (or none was measured)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=None,
        help="idle period for the CPU measurement (default 60)",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as markdown (for the README)"
    )
    parser.add_argument(
        "--no-allocation-tables",
        action="store_true",
        help="leave out the in-process tables of bench/allocation.py",
    )
    parser.add_argument(
        "--no-commands",
        action="store_true",
        help="leave out the plugin modes and side commands of bench/commands.py",
    )
    parser.add_argument("--save", type=Path, metavar="FILE", help="also write the results to FILE (JSON)")
    parser.add_argument(
        "--show", type=Path, metavar="FILE", help="print the results saved in FILE instead of running"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (plugin logs)")
    args = parser.parse_args(argv)
    if args.show is not None:
        report = json.loads(args.show.read_text())
    else:
        report = run(options(args), keep=args.keep)
        if args.save is not None:
            args.save.write_text(json.dumps(report, indent=1) + "\n")
    status, text = render(report, markdown=args.markdown)
    print(text)
    return status if args.check else 0


def run(opts: Options, keep: bool = False) -> dict[str, Any]:
    """Run the benchmarks; the report is plain data (JSON-able): header lines and table sections."""
    workdir = Path(tempfile.mkdtemp(prefix="nvdp-bench-", dir="/tmp"))
    started = time.monotonic()
    compile_bytecode()
    try:
        table = measure(Session(opts, workdir))
    finally:
        if keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    mode = "quick" if opts.quick else "full"
    header = [
        *machine_lines(),
        f"run:     {mode}, {time.monotonic() - started:.0f} s, {time.strftime('%Y-%m-%d')}",
    ]
    sections = [[title, [dataclasses.asdict(r) for r in rows]] for title, rows in table.sections]
    return {"header": header, "sections": sections}


def render(report: dict[str, Any], markdown: bool = False) -> tuple[int, str]:
    """The report as text, ending with the verdict lines, and the exit status of `--check`."""
    table = Table([(title, [Row(**r) for r in rows]) for title, rows in report["sections"]])
    status, lines = verdict(table.rows())
    body = table.markdown() if markdown else table.plain()
    return status, "\n".join([*report["header"], "", body, "", *lines])


if __name__ == "__main__":
    raise SystemExit(main())
