"""The one results table of `python -m bench`: its rows, and the plain and markdown renderings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024


@dataclass
class Row:
    """One measurement of one plugin; `ok` is None where no budget applies."""

    measurement: str
    plugin: str = ""
    n: str = ""
    p50: float | None = None  # ms
    p99: float | None = None
    max: float | None = None
    rate: float | None = None  # calls/s
    value: str = ""
    ratio: float | None = None
    budget: str = ""
    ok: bool | None = None


@dataclass
class Table:
    """Titled sections of rows, in the order they were measured."""

    sections: list[tuple[str, list[Row]]] = field(default_factory=list)

    def section(self, title: str) -> list[Row]:
        rows: list[Row] = []
        self.sections.append((title, rows))
        return rows

    def rows(self) -> list[Row]:
        return [r for _, rows in self.sections for r in rows]

    HEADER = (
        "measurement",
        "plugin",
        "n",
        "p50 ms",
        "p99 ms",
        "max ms",
        "calls/s",
        "value",
        "ratio",
        "budget",
        "ok",
    )
    LEFT = (0, 1, 7)  # the text columns; the others are numbers, right-aligned

    @staticmethod
    def cells(row: Row) -> list[str]:
        return [
            row.measurement,
            row.plugin,
            row.n,
            milliseconds(row.p50),
            milliseconds(row.p99),
            milliseconds(row.max),
            "" if row.rate is None else f"{row.rate:.0f}",
            row.value,
            "" if row.ratio is None else f"{row.ratio:.2f}x",
            row.budget,
            "" if row.ok is None else ("yes" if row.ok else "NO"),
        ]

    def plain(self) -> str:
        body = [self.cells(r) for r in self.rows()]
        widths = [
            max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(self.HEADER)
        ]

        def line(cells: Sequence[str]) -> str:
            out = [
                c.ljust(w) if i in self.LEFT else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(out).rstrip()

        lines = [line(self.HEADER), "  ".join("-" * w for w in widths)]
        for title, rows in self.sections:
            lines.append(f"[{title}]")
            lines += [line(self.cells(r)) for r in rows]
        return "\n".join(lines)

    def markdown(self) -> str:
        def esc(text: str) -> str:
            return text.replace("|", "\\|")

        lines = [
            "| " + " | ".join(self.HEADER) + " |",
            "|" + "|".join("---" if i in self.LEFT else "---:" for i in range(len(self.HEADER))) + "|",
        ]
        for title, rows in self.sections:
            lines.append(f"| **{esc(title)}** |" + " |" * (len(self.HEADER) - 1))
            lines += ["| " + " | ".join(esc(c) for c in self.cells(r)) + " |" for r in rows]
        return "\n".join(lines)


def milliseconds(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def megabytes(mib: float) -> str:
    """A size in MiB as the budgets state it (MB = 1e6 bytes), MiB beside it."""
    return f"{mib * MIB / 1e6:.1f} MB ({mib:.1f} MiB)"
