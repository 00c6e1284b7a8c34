"""The in-process benchmarks' rows in the one table: allocation time and quality
(bench/allocation.py) and the device rescan's CPU (bench/rescan.py)."""

from __future__ import annotations

from bench.budgets import RESCAN_BUDGET_MS
from bench.session import Session
from bench.table import Row


def _number(value: object) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def allocation_tables(s: Session) -> None:
    try:
        from bench import allocation
    except ImportError:
        return
    s.progress("in-process allocation tables (bench/allocation.py)")
    all_rows = allocation.rows()
    for table in dict.fromkeys(str(r["table"]) for r in all_rows):
        rows = s.table.section(f"{table} (bench/allocation.py, in process)")
        for r in (r for r in all_rows if r["table"] == table):
            if "p50_ms" in r:
                rows.append(
                    Row(
                        str(r["case"]),
                        "in-proc",
                        str(r.get("requests", "")),
                        _number(r["p50_ms"]),
                        _number(r["p99_ms"]),
                        _number(r["max_ms"]),
                    )
                )
            else:
                rest = {k: v for k, v in r.items() if k not in ("table", "case", "requests")}
                total = r.get("requests")
                value = ", ".join(f"{k.replace('_', ' ')} {v}/{total}" for k, v in rest.items())
                rows.append(Row(str(r["case"]), "in-proc", str(total or ""), value=value))


def rescan_table(s: Session) -> None:
    from bench import rescan

    s.progress("device rescan CPU (bench/rescan.py)")
    rows = s.table.section("device rescan, nothing changing (bench/rescan.py, in process)")
    for r in rescan.rows():
        value = (
            f"{r.enumerate_us + r.compare_us:.0f} µs CPU/tick, "
            f"{r.per_minute_10s_ms:.2f} ms CPU/min at 10 s; real NVML adds {r.nvml_calls} calls/tick"
        )
        row = Row(f"rescan, {r.node}", "nvdp", str(rescan.TICKS), value=value)
        row.budget, row.ok = f"{RESCAN_BUDGET_MS} ms/min", r.per_minute_10s_ms <= RESCAN_BUDGET_MS
        rows.append(row)
