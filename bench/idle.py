"""Processes at rest: idle CPU and wake-ups of the plugin and the floor, and the rows of
bench/commands.py (peak RSS, heavy imports and idle CPU of the plugin's modes and the side commands)."""

from __future__ import annotations

import contextlib
import time

from bench.budgets import IDLE_BUDGET_PCT, SIDE_IDLE_BUDGET_PCT
from bench.session import DeviceSetSpec, Session
from bench.table import MIB, Row, megabytes
from nvdp.sim.kubelet import Kubelet
from testkit import Process, ProcStats


def idle(s: Session) -> None:
    seconds = s.o.idle_seconds
    s.progress(f"idle CPU for {seconds:g} s")
    rows = s.table.section(
        f"idle for {seconds:g} s after registering (ListAndWatch open): CPU time, wake-ups"
    )
    with contextlib.ExitStack() as stack:
        watched: list[tuple[str, str, Process]] = []
        for label, metrics, extra in (
            ("8 GPUs, /metrics off, rescan every 10 s (default)", False, ()),
            ("8 GPUs, /metrics on, rescan every 10 s (default)", True, ()),
            ("8 GPUs, /metrics off, rescan off", False, ("--device-rescan-interval", "0")),
        ):
            kubelet = stack.enter_context(Kubelet(s.fresh_dir("idle")))
            process = stack.enter_context(
                s.plugin(kubelet, DeviceSetSpec(label, "sim:dgx-a100", metrics=metrics), extra=extra)
            )
            watched.append((label, "nvdp", process))
        kubelet = stack.enter_context(Kubelet(s.fresh_dir("idle")))
        watched.insert(0, ("8 devices", "floor", stack.enter_context(s.floor(kubelet))))
        time.sleep(1.0)  # let start-up work finish before counting
        before = {p.pid: ProcStats.read(p.pid) for _, _, p in watched}
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        for label, name, process in watched:
            after, start = ProcStats.read(process.pid), before[process.pid]
            cpu_ms = (after.cpu_s - start.cpu_s) * 1e3
            pct = cpu_ms / 10 / elapsed
            wakeups = (after.switches - start.switches) / elapsed
            value = f"{cpu_ms:.0f} ms CPU = {pct:.3f}% core, {wakeups:.0f} wake-ups/s"
            row = Row(f"idle, {label}", name, f"{elapsed:.0f} s", value=value)
            if name == "nvdp":
                row.budget, row.ok = f"{IDLE_BUDGET_PCT}% core", pct <= IDLE_BUDGET_PCT
            rows.append(row)


def commands_table(s: Session) -> None:
    from bench import commands

    seconds = min(s.o.idle_seconds, 30.0)
    s.progress(f"plugin modes and side commands: RSS, idle CPU for {seconds:g} s (bench/commands.py)")
    measured = commands.measure(seconds)
    rows = s.table.section(
        "plugin modes and side commands: peak RSS (VmHWM); heavy modules imported"
        f" ({', '.join(commands.HEAVY)}); idle {seconds:g} s (bench/commands.py)"
    )
    for m in measured:
        budget = commands.budget_mb(m)
        heavy = "" if m.heavy is None else f"; heavy modules: {', '.join(m.heavy) or 'none'}"
        row = Row(
            f"{m.what}: peak RSS",
            "nvdp",
            value=megabytes(m.peak_mb * 1e6 / MIB) + heavy,
            budget=f"{budget:.0f} MB" + ("; no heavy" if m.kind == "plugin" else ""),
            ok=m.peak_mb <= budget and (m.kind != "plugin" or m.heavy == []),
        )
        rows.append(row)
        if m.idle_cpu_ms is not None:
            pct = m.idle_cpu_ms / 10 / m.idle_s
            idle_budget = IDLE_BUDGET_PCT if m.kind == "plugin" else SIDE_IDLE_BUDGET_PCT
            children = f"; its children {m.idle_children_ms:.0f} ms" if m.idle_children_ms else ""
            rows.append(
                Row(
                    f"{m.what}: idle",
                    "nvdp",
                    f"{m.idle_s:.0f} s",
                    value=f"{m.idle_cpu_ms:.0f} ms CPU = {pct:.3f}% core, {m.wakeups:.0f} wake-ups/s"
                    + children,
                    budget=f"{idle_budget}% core",
                    ok=pct <= idle_budget,
                )
            )
