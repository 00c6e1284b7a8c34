"""The claims' shares of the GPUs shared by capacity (`nvdp.plugins.dra.capacity`): each enforced by MPS.

- A claim's share makes its containers clients of its GPU's MPS daemon (`nvdp.plugins.dra.mps`, the one the
  claims' MPS configs use too: the daemon named by the GPU's UUID, held by the claim's UID), with the
  pinned memory limit and thread percentage of the share; the claim is answered once it is ready.
- A daemon that cannot start fails the claim with the reason; the next claim tries again.
- The shares of the claims prepared since the start never exceed a capacity of their GPU.
- `stop()` (the plugin's stop) stops the daemons (`DraMps.stop`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from nvdp.base.errors import MpsError
from nvdp.base.logs import log_event
from nvdp.base.units import parse_quantity
from nvdp.config.model import Dra
from nvdp.node.gpus.inventory import dra_sharing
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.dra.capacity import (
    COMPUTE,
    MEMORY,
    Share,
    capacity_misfits,
    kept_shared,
    one_gpu,
    share_of,
    shared_by_capacity,
)
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.plugins.dra.devices import DraDevice, quantity
from nvdp.plugins.dra.mps import ClientLimits, DraMps, client_edits

log = logging.getLogger(__name__)


class CapacityDaemons:
    """`edits(...)` for NodePrepareResources (any thread); `stop()` at the plugin's stop."""

    def __init__(self, mps: DraMps) -> None:
        self.mps = mps
        self._lock = threading.Lock()
        self.shared: frozenset[str] | None = None  # the GPUs shared by capacity, as last settled
        self._held: dict[str, tuple[Share, ...]] = {}  # claim UID -> its shares (since the start)

    def settle(
        self,
        dra: Dra,
        gpus: Sequence[GpuInfo],
        devices: Sequence[DraDevice],
        held: Collection[str],
        misfits: MisfitReport,
    ) -> list[DraDevice]:
        """`devices` with the GPUs shared by capacity made so: those `dra.consumableCapacity` names
        and those shared before that a prepared claim still `held` (uuids); their misfits told."""
        sharing, told = dra_sharing(dra, gpus)
        before = sharing.capacity if self.shared is None else self.shared  # at start: held claims are shares
        self.shared = kept_shared(sharing.capacity, before, held)
        misfits.update("sharing", (*told, *capacity_misfits(gpus, self.shared)))
        return shared_by_capacity(devices, self.shared)

    def edits(
        self, ref: ClaimRef, allocated: Sequence[Allocated], devices: Mapping[str, DraDevice]
    ) -> tuple[dict[str, dict[str, list[Any]]], tuple[Share, ...]]:
        """The claim's shares and, per shared device, the CDI containerEdits of an MPS client limited
        to them; the GPU's daemon started first (and waited for). Raises ClaimError, also for shares
        past what the claims prepared since the start left of the GPU."""
        claim = str(ref)
        by_device: dict[str, Share] = {}
        for result in allocated:
            device = devices[result.device]
            if not device.allow_multiple_allocations:
                continue
            share = share_of(device, result.consumed_capacity, claim)
            if (before := by_device.get(device.name)) is not None:  # two requests, one device
                share = Share(
                    share.device,
                    share.gpu_uuid,
                    before.memory_bytes + share.memory_bytes,
                    min(100, before.compute + share.compute),
                )
            by_device[device.name] = share
        shares = tuple(by_device.values())
        gpu = one_gpu(shares, claim)
        if gpu is None:
            return {}, ()
        self._take(ref.uid, shares, devices, claim)
        try:
            daemon = self.mps.ensure_daemon([gpu], ref.uid)
        except MpsError as error:
            self.release(ref.uid)
            raise ClaimError(f"ResourceClaim {claim}: {shares[0].device}: {error}") from None
        log_event(
            log,
            logging.INFO,
            "claim's share",
            claim=claim,
            gpu=gpu,
            shares="; ".join(s.describe() for s in shares),
        )
        limits = {s.device: ClientLimits(s.compute or None, {gpu: s.memory_bytes}) for s in shares}
        return {name: client_edits(daemon, lim) for name, lim in limits.items()}, shares

    def release(self, uid: str) -> None:
        """The claim is unprepared: its shares are the GPUs' again, its hold of the daemon dropped."""
        with self._lock:
            self._held.pop(uid, None)
        self.mps.release(uid)

    def _take(self, uid: str, shares: Sequence[Share], devices: Mapping[str, DraDevice], claim: str) -> None:
        """Hold the claim's shares, if what the other prepared claims hold of each GPU leaves room."""
        with self._lock:
            for share in shares:
                others = [
                    s for u, held in self._held.items() if u != uid for s in held if s.device == share.device
                ]
                total = {
                    name: parse_quantity(c["value"]) for name, c in devices[share.device].capacity.items()
                }
                for name, asked, used in (
                    (MEMORY, share.memory_bytes, sum(s.memory_bytes for s in others)),
                    (COMPUTE, share.compute, sum(s.compute for s in others)),
                ):
                    if asked and used + asked > total.get(name, 0):
                        left = quantity(max(0, total.get(name, 0) - used))["value"]
                        raise ClaimError(
                            f"ResourceClaim {claim}: {share.device} has {name} {left} left by the claims "
                            f"prepared on it, not the {quantity(asked)['value']} the claim consumes"
                        )
            self._held[uid] = tuple(shares)

    def stop(self) -> None:
        """The plugin stops: its MPS daemons quit (their records kept for the next start)."""
        self.mps.stop()
