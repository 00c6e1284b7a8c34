"""Live device-layout changes: a timer re-reads the node's GPU / MIG layout and asks the plugin's main
loop (the device plugin's supervisor, the DRA plugin's loop) to re-apply what it serves when the
layout differs from the one it serves (`--device-rescan-interval`).

A *layout* (`nvdp.node.nvml.types.GpuLayout`) is, per GPU: its index, uuid, MIG mode and its MIG devices
as (GPU instance id, compute instance id, profile) and their UUIDs (an identical layout destroyed and
created again has new ones), nothing else, so a change of any other fact
(memory, NUMA node, ...) is no layout change. A GPU that appears or disappears (hot-unplug, driver
rebind) is a change too.

Each tick is `Nvml.mig_layout()`, the cheap query (per GPU: handle, UUID, MIG mode, MIG devices'
UUIDs, instance ids and profiles; no full enumeration), and one comparison of small tuples with the served
layout, which is derived once per served enumeration; nothing else happens while nothing changes.
On a change: one log line per GPU that changed (old and new layout), the layout-change counter, then
`on_change()` (the supervisor's rescan request: the same diff a reload applies, which enumerates the
node in full). The baseline is what the supervisor serves (`served()`, read each tick), so SIGHUP
reloads move it too; a layout that was already reported is not reported again while it stays (a
layout the config refuses is said once, not every tick).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event
from nvdp.base.promtext import Counter as PromCounter
from nvdp.base.promtext import Registry
from nvdp.node.nvml.types import GpuInfo, GpuLayout

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
CHANGE_KINDS = ("mig", "gpu-appeared", "gpu-disappeared", "gpu-index")
_MESSAGES = {
    "mig": "MIG layout changed",
    "gpu-appeared": "GPU appeared",
    "gpu-disappeared": "GPU disappeared",
    "gpu-index": "GPU index changed",  # another GPU appeared or disappeared before it
}


Layout = Mapping[str, GpuLayout]  # GPU uuid -> its layout


def layout_of(gpus: Sequence[GpuInfo]) -> dict[str, GpuLayout]:
    """The layout part of an enumeration (what `Nvml.mig_layout()` answers for the same node)."""
    return {g.uuid: GpuLayout.of(g) for g in gpus}


@dataclass(frozen=True)
class LayoutChange:
    kind: str  # one of CHANGE_KINDS
    old: GpuLayout | None
    new: GpuLayout | None

    @property
    def gpu(self) -> GpuLayout:
        gpu = self.new or self.old
        assert gpu is not None
        return gpu

    def log(self) -> None:
        fields: dict[str, object] = {"gpu": self.gpu.index, "uuid": self.gpu.uuid}
        if self.kind == "gpu-index" and self.old is not None:
            fields["old"] = self.old.index
        else:
            if self.old is not None:
                fields["old"] = self.old.describe()
            if self.new is not None:
                fields["new"] = self.new.describe()
            if self.old is not None and self.new is not None and self.old.describe() == self.new.describe():
                fields["recreated"] = "new MIG device UUIDs"  # the same layout destroyed and created again
        level = logging.WARNING if self.kind.startswith("gpu-") else logging.INFO
        log_event(log, level, _MESSAGES[self.kind], **fields)


def layout_changes(old: Layout, new: Layout) -> list[LayoutChange]:
    """Per GPU, what differs between two layouts, in GPU index order."""
    changes = [LayoutChange("gpu-disappeared", g, None) for u, g in old.items() if u not in new]
    changes += [LayoutChange("gpu-appeared", None, g) for u, g in new.items() if u not in old]
    changes += [LayoutChange(_kind(old[u], g), old[u], g) for u, g in new.items() if u in old and old[u] != g]
    return sorted(changes, key=lambda c: (c.gpu.index, c.kind))


def _kind(old: GpuLayout, new: GpuLayout) -> str:
    same_mig = (old.mig_enabled, old.instances, old.mig_uuids) == (
        new.mig_enabled,
        new.instances,
        new.mig_uuids,
    )
    return "gpu-index" if same_mig else "mig"


class LayoutRescanner:
    """The rescan timer thread. `start` and an idempotent `stop`; `check` is one tick (tests, bench).

    `read()` is the node's layout now (`Nvml.mig_layout`); `served()` is the enumeration the served
    resources come from, None while there is none yet (before the first apply, or NVML not
    initialised): no tick then. `counted(kind)` is called once per GPU change (the metric).
    """

    def __init__(
        self,
        read: Callable[[], Layout],
        served: Callable[[], Sequence[GpuInfo] | None],
        on_change: Callable[[], None],
        interval: float = DEFAULT_INTERVAL_S,
        *,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("a rescan interval must be > 0 (0 means: no rescanner)")
        self._read = read
        self._served = served
        self._on_change = on_change
        self.interval = interval
        self._counted = counted
        self._reported: Layout | None = None  # the last layout reported as a change
        self._base: tuple[Sequence[GpuInfo], Layout] | None = None  # served enumeration, its layout
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="device-rescan", daemon=True)
        self._thread.start()
        log_event(log, logging.INFO, "device rescan started", interval=f"{self.interval:g}s")

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a bug must not end live rescans silently
                log.exception("device rescan failed")

    def check(self) -> list[LayoutChange]:
        """One tick: compare the node's layout with the served one; report and request a re-apply
        when they differ (once per new layout). Returns the changes reported."""
        served = self._served()
        if served is None:
            return []
        try:
            now = self._read()
        except NvdpError as error:
            if not self._failing:
                log_event(
                    log, logging.WARNING, "device rescan: enumeration failed; will retry", error=str(error)
                )
            self._failing = True
            return []
        if self._failing:
            log_event(log, logging.INFO, "device rescan: enumeration works again")
            self._failing = False
        base = self._served_layout(served)
        if now == base:
            self._reported = None
            return []
        if now == self._reported:
            return []  # reported already; the supervisor applied or refused it
        changes = layout_changes(base, now)
        self._reported = now
        for change in changes:
            change.log()
            if self._counted is not None:
                self._counted(change.kind)
        self._on_change()
        return changes

    def _served_layout(self, served: Sequence[GpuInfo]) -> Layout:
        """The served enumeration's layout, derived again only when the supervisor serves a new one."""
        if self._base is None or self._base[0] is not served:
            self._base = (served, layout_of(served))
        return self._base[1]


class RescanTarget(Protocol):
    """The supervisor as the rescanner sees it."""

    def served_gpus(self) -> Sequence[GpuInfo] | None: ...
    def request_rescan(self) -> None: ...


class LayoutSource(Protocol):
    """The NVML facade as the rescanner sees it: the cheap layout query only."""

    def mig_layout(self) -> dict[str, GpuLayout]: ...


def layout_change_counter(registry: Registry) -> Callable[[str], None]:
    """`nvdp_device_layout_changes_total{kind}` in `registry`; returns what counts one change."""
    counter = registry.register(
        PromCounter(
            "nvdp_device_layout_changes_total",
            "GPU layout changes seen by the device rescan, per GPU (MIG re-partition, GPU appeared or gone).",
            ["kind"],
        )
    )
    for kind in CHANGE_KINDS:
        counter.labels(kind)
    return lambda kind: counter.labels(kind).inc()


def rescanner_for(
    interval: float, nvml: LayoutSource, target: RescanTarget, registry: Registry | None
) -> LayoutRescanner | None:
    """The daemon's rescanner (None when `--device-rescan-interval` is 0)."""
    if interval <= 0:
        log_event(log, logging.INFO, "device rescan disabled; layout changes need a SIGHUP")
        return None
    counted = layout_change_counter(registry) if registry is not None else None
    return LayoutRescanner(
        nvml.mig_layout, target.served_gpus, target.request_rescan, interval, counted=counted
    )
