"""Prometheus text exposition, format 0.0.4: labelled counters, gauges and fixed-bucket histograms.

Only what nvdp needs, written out so that the plugin process imports no prometheus_client (its package
imports its exposition module, which pulls in ssl, http.client, email and more: megabytes of RSS).

Thread-safe: each family has one lock, shared by its children. `labels()` resolves a child once; a hot
path keeps the child and pays one lock and a float add per update. Families built at scrape time (state
read from elsewhere) are plain `MetricFamily` snapshots returned by any object with a `collect()`.
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MetricType = Literal["counter", "gauge", "histogram"]
Sample = tuple[str, tuple[tuple[str, str], ...], float]  # full name, label pairs, value

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class MetricFamily:
    """One family as a scrape sees it: HELP, TYPE and its samples."""

    __slots__ = ("help", "labelnames", "name", "samples", "type")

    def __init__(self, name: str, help: str, type: MetricType, labelnames: Sequence[str] = ()) -> None:
        self.name, self.help, self.type, self.labelnames = name, help, type, tuple(labelnames)
        self.samples: list[Sample] = []

    def add(self, labelvalues: Sequence[str], value: float, suffix: str = "", le: str | None = None) -> None:
        labels = tuple(zip(self.labelnames, labelvalues, strict=True))
        if le is not None:
            labels += (("le", le),)
        self.samples.append((self.name + suffix, labels, value))


class Collector(Protocol):
    def collect(self) -> Iterable[MetricFamily]: ...


C = TypeVar("C")
K = TypeVar("K", bound=Collector)


class _Metric(Generic[C]):
    """A family of children, one per label-value tuple (a single child when there are no labels)."""

    type: ClassVar[MetricType]

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        bad = [n for n in labelnames if not _LABEL_NAME.fullmatch(n) or n.startswith("__") or n == "le"]
        if not _METRIC_NAME.fullmatch(name) or bad:
            raise ValueError(f"invalid metric {name!r} or label names {bad}")
        self.name, self.help, self.labelnames = name, help, tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], C] = {}
        if not labelnames:
            self.labels()  # exposed (at zero) from the start

    def labels(self, *labelvalues: str) -> C:
        """The child for these label values (in `labelnames` order), created on first use."""
        child = self._children.get(labelvalues)
        if child is None:
            if len(labelvalues) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {labelvalues}")
            with self._lock:
                child = self._children.setdefault(labelvalues, self._child())
        return child

    def collect(self) -> list[MetricFamily]:
        family = MetricFamily(self.name, self.help, self.type, self.labelnames)
        with self._lock:
            for labelvalues, child in self._children.items():
                self._add_samples(family, labelvalues, child)
        return [family]

    def _child(self) -> C:
        raise NotImplementedError

    def _add_samples(self, family: MetricFamily, labelvalues: tuple[str, ...], child: C) -> None:
        raise NotImplementedError


class CounterChild:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self.value += amount


class GaugeChild:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)  # one attribute store: atomic

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last one is +Inf
        self._sum = 0.0

    def observe(self, value: float) -> None:
        bucket = bisect_left(self._bounds, value)  # the first bound >= value: `le` is inclusive
        with self._lock:
            self._counts[bucket] += 1
            self._sum += value


class Counter(_Metric[CounterChild]):
    """Name it with the `_total` suffix: the name is exposed as given."""

    type = "counter"

    def _child(self) -> CounterChild:
        return CounterChild(self._lock)

    def _add_samples(self, family: MetricFamily, labelvalues: tuple[str, ...], child: CounterChild) -> None:
        family.add(labelvalues, child.value)


class Gauge(_Metric[GaugeChild]):
    type = "gauge"

    def _child(self) -> GaugeChild:
        return GaugeChild(self._lock)

    def _add_samples(self, family: MetricFamily, labelvalues: tuple[str, ...], child: GaugeChild) -> None:
        family.add(labelvalues, child.value)


class Histogram(_Metric[HistogramChild]):
    """Fixed buckets (upper bounds, ascending; +Inf is implied)."""

    type = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> None:
        bounds = tuple(float(b) for b in buckets if b != math.inf)
        if not bounds or list(bounds) != sorted(set(bounds)) or math.isnan(bounds[-1]):
            raise ValueError(f"{name}: buckets must be distinct and ascending, got {buckets}")
        self.bounds = bounds
        super().__init__(name, help, labelnames)

    def _child(self) -> HistogramChild:
        return HistogramChild(self._lock, self.bounds)

    def _add_samples(self, family: MetricFamily, labelvalues: tuple[str, ...], child: HistogramChild) -> None:
        total = 0
        for bound, count in zip((*self.bounds, math.inf), child._counts, strict=True):
            total += count
            family.add(labelvalues, total, "_bucket", le=format_value(bound))
        family.add(labelvalues, total, "_count")
        family.add(labelvalues, child._sum, "_sum")


class Registry:
    """The collectors one /metrics answer renders, in registration order."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: K) -> K:
        self._collectors.append(collector)
        return collector

    def render(self) -> bytes:
        return render(family for collector in self._collectors for family in collector.collect())


def render(families: Iterable[MetricFamily]) -> bytes:
    """The text exposition: `# HELP` and `# TYPE` once per family, then its samples."""
    lines: list[str] = []
    seen: set[str] = set()
    for family in families:
        if family.name in seen:
            raise ValueError(f"metric family {family.name} collected twice")
        seen.add(family.name)
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for name, labels, value in family.samples:
            if labels:
                pairs = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
                lines.append(f"{name}{{{pairs}}} {format_value(value)}")
            else:
                lines.append(f"{name} {format_value(value)}")
    return "".join(line + "\n" for line in lines).encode()


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """As Go formats it: `+Inf`, `-Inf`, `NaN`; integral values without `.0`; else the shortest repr."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)
