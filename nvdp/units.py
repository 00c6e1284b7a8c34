"""The units nvdp reads and writes: Go's durations ("1h30m", "300ms"), as Go's time.ParseDuration
reads them and Duration.String writes them, and binary sizes (MiB, a size in words)."""

from __future__ import annotations

import re

MIB = 1 << 20
MAX_GO_DURATION_S = (2**63 - 1) / 1e9  # Go durations are int64 nanoseconds

_NS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "μs": 10**3,
    "ms": 10**6,
    "s": 10**9,  # nanoseconds per unit
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_GO_DURATION = re.compile(r"(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
_TERM = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration ("1h30m", "300ms", "0"), in seconds; ValueError when `text` is no
    duration. The range (`MAX_GO_DURATION_S`) is the caller's to check."""
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not _GO_DURATION.fullmatch(body):
        raise ValueError("invalid duration")
    seconds = sum(float(number) * _NS[unit] for number, unit in _TERM.findall(body)) / 1e9
    return -seconds if text.startswith("-") else seconds


def format_go_duration(seconds: float) -> str:
    """Go's Duration.String: "5m0s", "1h0m0s", "300ms", "1.5µs", "0s"."""
    ns = round(seconds * 1e9)
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        unit, size = ("ns", 1) if ns < 1_000 else ("µs", 1_000) if ns < 1_000_000 else ("ms", 1_000_000)
        return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = _decimal(rest, 10**9) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _decimal(value: int, size: int) -> str:
    whole, fraction = divmod(value, size)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def describe_size(size: int) -> str:
    """A byte count in words: "1 MiB", "4 KiB", "100 bytes"."""
    for unit, factor in (("MiB", MIB), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"
