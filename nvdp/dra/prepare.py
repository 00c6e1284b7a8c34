"""NodePrepareResources and NodeUnprepareResources, apart from their wire: per claim, an answer or a
one-line error, never one claim's failure for the others.

Prepare reads the claim through the API (`nvdp.dra.claims`: the UID must match, the allocation is
there), takes this driver's results in this node's pool, checks each device is on the node and
healthy (an Unhealthy device is not handed to a new claim), writes the claim's CDI spec and then the
checkpoint, and answers the CDI device IDs per request. A claim prepared already (the checkpoint says
so, across restarts) gets the same answer again without asking the API. Unprepare removes the spec,
then the checkpoint entry; an unknown claim is unprepared already. Calls are serialised (one lock),
as the checkpoint is one file.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from nvdp.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from nvdp.dra.claim_specs import ClaimSpecs
from nvdp.dra.claims import ClaimError, ClaimRef, allocated_devices
from nvdp.dra.cluster import ResourceApi
from nvdp.dra.devices import DraDevice
from nvdp.dra.slices import Taint
from nvdp.errors import KubeError
from nvdp.logs import log_event

log = logging.getLogger(__name__)


class Inventory(Protocol):
    """This node's devices now, and their health (the driver's)."""

    def device(self, name: str) -> DraDevice | None: ...
    def unhealthy(self, name: str) -> Taint | None: ...


@dataclass(frozen=True)
class ClaimAnswer:
    """One claim's answer: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer:
    def __init__(
        self,
        api: ResourceApi,
        pool: str,
        inventory: Inventory,
        specs: ClaimSpecs,
        checkpoint: Checkpoint,
        *,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self._api = api
        self._changed = changed  # told after a claim was prepared or unprepared
        self.pool = pool
        self._inventory = inventory
        self._specs = specs
        self._checkpoint = checkpoint
        self._lock = threading.Lock()
        self.prepared: dict[str, PreparedClaim] = checkpoint.load()
        self._forget_orphan_specs()

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimAnswer]:
        with self._lock:
            before = len(self.prepared)
            answers = {claim.uid: self._prepare(claim) for claim in claims}
            changed = len(self.prepared) != before
        if changed and self._changed is not None:
            self._changed()
        return answers

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """UID -> "" when unprepared, else the error."""
        with self._lock:
            before = len(self.prepared)
            answers = {claim.uid: self._unprepare(claim) for claim in claims}
            changed = len(self.prepared) != before
        if changed and self._changed is not None:
            self._changed()
        return answers

    def holders(self) -> dict[str, str]:
        """Device name -> the claim holding it ("claim namespace/name"), for the hand-over."""
        with self._lock:
            return {
                d.device_name: f"claim {c.namespace}/{c.name}"
                for c in self.prepared.values()
                for d in c.devices
            }

    def _prepare(self, ref: ClaimRef) -> ClaimAnswer:
        known = self.prepared.get(ref.uid)
        if known is not None:
            return ClaimAnswer(known.devices)
        try:
            claim = self._api.claims().get(ref.namespace, ref.name)
            allocated = allocated_devices(claim, ref, self.pool)
            devices: dict[str, DraDevice] = {}  # by the name the allocation gives (maybe a former one)
            for result in allocated:
                device = self._inventory.device(result.device)
                if device is None:
                    raise ClaimError(f"device {result.device} is not on this node (any more)")
                taint = self._inventory.unhealthy(result.device)
                if taint is not None:
                    raise ClaimError(
                        f"device {result.device} is Unhealthy ({taint.value}); not handed to a new claim"
                    )
                devices[result.device] = device
            ids = self._specs.write(ref.uid, list({d.name: d for d in devices.values()}.values()))
            answer = tuple(
                PreparedDevice(
                    (r.request,) if r.request else (), self.pool, r.device, (ids[devices[r.device].name],)
                )
                for r in allocated
            )
            prepared = PreparedClaim(ref.uid, ref.namespace, ref.name, answer)
            self._checkpoint.save({**self.prepared, ref.uid: prepared})
        except (ClaimError, KubeError, OSError) as error:
            message = str(error) if isinstance(error, ClaimError) else f"ResourceClaim {ref}: {error}"
            log_event(log, logging.WARNING, "claim not prepared", claim=str(ref), uid=ref.uid, error=message)
            return ClaimAnswer(error=message)
        self.prepared[ref.uid] = prepared
        log_event(
            log,
            logging.INFO,
            "claim prepared",
            claim=str(ref),
            uid=ref.uid,
            devices=",".join(d.device_name for d in answer) or "none",
        )
        return ClaimAnswer(answer)

    def _unprepare(self, ref: ClaimRef) -> str:
        try:
            self._specs.remove(ref.uid)
            if ref.uid in self.prepared:
                self._checkpoint.save({u: c for u, c in self.prepared.items() if u != ref.uid})
        except OSError as error:
            message = f"cannot unprepare ResourceClaim {ref}: {error}"
            log_event(
                log, logging.WARNING, "claim not unprepared", claim=str(ref), uid=ref.uid, error=message
            )
            return message
        if self.prepared.pop(ref.uid, None) is not None:
            log_event(log, logging.INFO, "claim unprepared", claim=str(ref), uid=ref.uid)
        return ""

    def _forget_orphan_specs(self) -> None:
        """Remove claim specs no prepared claim owns (written just before a crash, never checkpointed:
        the kubelet prepares such a claim again, or never will)."""
        for uid in self._specs.on_disk() - set(self.prepared):
            try:
                self._specs.remove(uid)
                log_event(log, logging.INFO, "removed the CDI spec of a claim not prepared", uid=uid)
            except OSError as error:
                log_event(log, logging.WARNING, "cannot remove a claim's CDI spec", uid=uid, error=str(error))
