"""The simulated node's answer to the layout query (`SimNvml.mig_layout`), kept while nothing it
is read from changes: the DRA plugin asks twice a second, and an idle node then costs a comparison.

It is read from each GPU's MIG devices (a tuple, replaced on every change: an event, a MIG device
made or destroyed), its lost flag, and how many GPUs were listed once (a GPU lost before its first
listing says MIG disabled, like its faulty record)."""

from __future__ import annotations

from collections.abc import Sequence

from nvdp.node.nvml.sim.node import SimGpu
from nvdp.node.nvml.types import GpuLayout, MigDeviceInfo

GpuFacts = tuple[tuple[MigDeviceInfo, ...] | None, bool]  # a GPU's MIG devices (None: MIG off), lost


class KeptLayout:
    """`get(gpus, facts, enumerated)`: the layout, read again only when `facts` or the listed GPUs
    changed. The caller holds the node's lock."""

    def __init__(self) -> None:
        self._key: tuple[int, tuple[GpuFacts, ...]] | None = None
        self._layout: dict[str, GpuLayout] = {}

    def get(
        self, gpus: Sequence[SimGpu], facts: Sequence[GpuFacts], enumerated: set[int]
    ) -> dict[str, GpuLayout]:
        key = (len(enumerated), tuple(facts))  # tuples compare by identity first: unchanged is cheap
        if key != self._key:
            self._key, self._layout = key, read_layout(gpus, facts, enumerated)
        return dict(self._layout)


def read_layout(
    gpus: Sequence[SimGpu], facts: Sequence[GpuFacts], enumerated: set[int]
) -> dict[str, GpuLayout]:
    return {
        gpu.uuid: GpuLayout(gpu.index, gpu.uuid, False)
        if lost and gpu.index not in enumerated
        else GpuLayout(gpu.index, gpu.uuid, mig is not None)
        if not mig
        else GpuLayout(
            gpu.index,
            gpu.uuid,
            True,
            tuple(sorted((m.gi_id, m.ci_id, m.profile) for m in mig)),
            tuple(sorted(m.uuid for m in mig)),
        )
        for gpu, (mig, lost) in zip(gpus, facts, strict=True)
    }
