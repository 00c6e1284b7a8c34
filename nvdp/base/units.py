"""The units nvdp reads and writes: Go's durations ("1h30m", "300ms"), as Go's time.ParseDuration
reads them and Duration.String writes them, binary sizes (MiB, a size in words), and Kubernetes
quantities ("4Gi", "512M", "1e9") as whole numbers."""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decimal import Decimal

MIB = 1 << 20
MAX_QUANTITY_DIGITS = 30  # a quantity is at most 10**31 (Kubernetes' own values stop at 2**63)
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
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)


@cache
def _quantity_suffixes() -> dict[str, Decimal]:
    """The factor of each quantity suffix (decimal is loaded only by a process that reads quantities)."""
    from decimal import Decimal

    return {
        **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
        **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9))},
        **{s: Decimal(10) ** e for s, e in (("T", 12), ("P", 15), ("E", 18), ("", 0))},
    }


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


def parse_quantity(text: object) -> int:
    """A Kubernetes resource quantity ("4Gi", "1500M", "1e9", "0.5Gi", or an int) as a whole number,
    rounded up (as Quantity.Value()); ValueError "invalid quantity" when `text` is no quantity, and
    "quantity out of range" past MAX_QUANTITY (refused before any arithmetic: `1e999999999`)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) and len(text) <= 64 else None
    if match is None:
        raise ValueError("invalid quantity")
    from decimal import ROUND_CEILING, Decimal

    number, suffix = Decimal(match[1]), match[2] or ""
    factor = _quantity_suffixes().get(suffix)
    exponent = int(suffix[1:]) if factor is None else 0
    if number and number.adjusted() + exponent + (factor or Decimal(1)).adjusted() > MAX_QUANTITY_DIGITS:
        raise ValueError("quantity out of range")
    try:
        value = number * (factor if factor is not None else Decimal(10) ** exponent)
    except ArithmeticError as error:  # a tiny one: below Decimal's range
        raise ValueError("invalid quantity") from error
    return int(value.to_integral_value(rounding=ROUND_CEILING))
