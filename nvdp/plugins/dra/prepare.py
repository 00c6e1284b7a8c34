"""NodePrepareResources and NodeUnprepareResources apart from their wire: per claim an answer or a
one-line error, never one claim's failure for the others.

- Prepare checks the claim's names (`claims.ref_problem`), reads it from the API (UID matches,
  allocated), takes this driver's results in this node's pool, checks each device is here and
  healthy, writes the CDI spec and answers the CDI device IDs per request.
- The checkpoint is written once for the call's claims, before any is answered; a prepared claim
  gets the same answer again without the API. Unprepare removes spec then entry; unknown is done.
- API reads run at once (up to API_READERS), outside the lock; decisions on the state are under
  the lock; a claim one call works on is waited for by another (`_busy`).
- An unreadable checkpoint is rebuilt: claims with a CDI spec on disk, or allocated here and
  reserved, stay prepared; ones not fully known are read from the API when prepared again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from nvdp.base.errors import KubeError
from nvdp.base.logs import log_event
from nvdp.node.cdi.names import qualified_name
from nvdp.plugins.dra.checkpoint import Checkpoint, MadeMig, PreparedClaim, PreparedDevice
from nvdp.plugins.dra.claim_parts import NO_CLAIMS, ClaimHooks
from nvdp.plugins.dra.claim_specs import ClaimSpecs
from nvdp.plugins.dra.claims import (
    Allocated,
    ClaimError,
    ClaimRef,
    allocated_devices,
    allocated_here,
    ref_problem,
)
from nvdp.plugins.dra.cluster import ResourceApi
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.names import CLAIM_CDI_KIND, claim_cdi_device
from nvdp.plugins.dra.sharing import OpaqueConfig, opaque_configs
from nvdp.plugins.dra.slices import Taint

log = logging.getLogger(__name__)

API_READERS = 8  # a call's claims read from the API at once


class MigMaker(Protocol):
    """Makes the MIG devices a claim's placements stand for (`nvdp.plugins.dra.dynamic_mig`)."""

    def make(
        self, uid: str, devices: dict[str, DraDevice]
    ) -> tuple[dict[str, DraDevice], tuple[MadeMig, ...]]:
        """The devices with each placement made a MIG device, and what was made. Raises ClaimError
        (nothing made then)."""
        ...

    def remove(self, made: Sequence[MadeMig]) -> str:
        """Destroy them; "" or why not."""
        ...


class Shares(Protocol):
    """The claims' shares of GPUs shared by capacity (`nvdp.plugins.dra.capacity_mps.CapacityDaemons`)."""

    def edits(
        self, ref: ClaimRef, allocated: Sequence[Allocated], devices: Mapping[str, DraDevice]
    ) -> tuple[dict[str, dict[str, list[Any]]], tuple[object, ...]]: ...
    def release(self, uid: str) -> None: ...


class Inventory(Protocol):
    """This node's devices now, and their health (the driver's)."""

    def device(self, name: str) -> DraDevice | None: ...
    def unhealthy(self, name: str) -> Taint | None: ...


@dataclass(frozen=True)
class ClaimAnswer:
    """One claim's answer: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class _Decided:
    """A claim read and checked: its allocation results and their devices, its spec to write."""

    ref: ClaimRef
    allocated: list[Allocated]
    devices: dict[str, DraDevice]  # by the name the allocation gives (maybe a former one)
    before: PreparedClaim | None  # a rebuilt claim's entry, kept if this one is not saved
    configs: list[OpaqueConfig]  # its opaque configs for this driver (`nvdp.plugins.dra.sharing`)


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
        shares: Shares | None = None,
        claims: ClaimHooks = NO_CLAIMS,
        mig: MigMaker | None = None,
    ) -> None:
        self._api = api
        self._shares = shares  # GPUs shared by capacity: their claims' MPS client edits
        self._claims = claims  # claims' sharing configs applied and undone, their pods read again
        self._mig = mig  # makes the MIG devices of dynamic-MIG placements (and removes them)
        self._changed = changed  # told after a claim was prepared or unprepared
        self.pool = pool
        self._inventory = inventory
        self._specs = specs
        self._checkpoint = checkpoint
        self._lock = threading.Condition()  # self.prepared and self._busy
        self._busy: set[str] = set()  # UIDs a call is preparing or unpreparing now
        self._save_lock = threading.Lock()  # checkpoint writes, each of the state as it is then
        loaded = checkpoint.load()
        self.prepared: dict[str, PreparedClaim] = loaded or {}
        orphans = self._specs.on_disk() - set(self.prepared)
        if loaded is None or orphans:
            self._rebuild(orphans, everything_here=loaded is None)

    # ---- the calls ----------------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimAnswer]:
        self._claims.touch(ref for ref in claims if ref_problem(ref) is None)  # a pod starts with them
        answers: dict[str, ClaimAnswer] = {}
        to_read: list[ClaimRef] = []
        with self._lock:
            for ref in _unique(claims):
                known = self.prepared.get(ref.uid)
                if (problem := ref_problem(ref)) is not None:
                    answers[ref.uid] = self._refused(ref, problem)
                elif known is not None and ref.uid not in self._busy and _complete(known):
                    answers[ref.uid] = ClaimAnswer(known.devices)
                else:
                    to_read.append(ref)
        if not to_read:
            return answers
        with ThreadPoolExecutor(min(API_READERS, len(to_read)), thread_name_prefix="dra-claim") as pool:
            read = list(pool.map(self._read, to_read))  # outside the lock: a read may hang
            decided: list[_Decided] = []
            with self._lock:
                uids = {ref.uid for ref in to_read}
                self._lock.wait_for(lambda: not uids & self._busy)
                for ref, allocated in zip(to_read, read, strict=True):
                    known = self.prepared.get(ref.uid)
                    if isinstance(allocated, ClaimAnswer):
                        answers[ref.uid] = allocated
                    elif known is not None and _complete(known):
                        answers[ref.uid] = ClaimAnswer(known.devices)
                    else:
                        found, configs = allocated
                        try:
                            devices = self._devices(found)
                            decided.append(_Decided(ref, found, devices, known, configs))
                        except ClaimError as error:
                            answers[ref.uid] = self._refused(ref, str(error))
                self._busy |= {d.ref.uid for d in decided}
            try:
                dev_nodes = self._specs.dev_nodes()
                written = list(pool.map(lambda d: self._write_spec(d, dev_nodes), decided))
            except BaseException:
                self._release(d.ref.uid for d in decided)
                raise
        new = {c.uid: c for c in written if isinstance(c, PreparedClaim)}
        with self._lock:
            self.prepared.update(new)
        unsaved = self._save() if new else ""
        with self._lock:
            for d, claim in zip(decided, written, strict=True):
                if isinstance(claim, ClaimAnswer):
                    answers[d.ref.uid] = claim
                elif unsaved:
                    self._claims.release(d.ref.uid)
                    if claim.made and self._mig is not None:
                        self._mig.remove(claim.made)
                    if d.before is None:
                        self.prepared.pop(claim.uid, None)
                    else:
                        self.prepared[claim.uid] = d.before
                    answers[d.ref.uid] = self._refused(d.ref, f"ResourceClaim {d.ref}: {unsaved}")
                else:
                    answers[d.ref.uid] = ClaimAnswer(claim.devices)
                    log_event(
                        log,
                        logging.INFO,
                        "claim prepared",
                        claim=str(d.ref),
                        uid=d.ref.uid,
                        devices=",".join(x.device_name for x in claim.devices) or "none",
                    )
            self._busy -= {d.ref.uid for d in decided}
            self._lock.notify_all()
        if new and not unsaved and self._changed is not None:
            self._changed()
        return {ref.uid: answers[ref.uid] for ref in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """UID -> "" when unprepared, else the error."""
        answers: dict[str, str] = {}
        removed: dict[str, tuple[ClaimRef, PreparedClaim]] = {}
        with self._lock:
            refs = [ref for ref in _unique(claims) if ref_problem(ref) is None]
            for ref in _unique(claims):
                if (problem := ref_problem(ref)) is not None:
                    answers[ref.uid] = f"cannot unprepare: {problem}"
            uids = {ref.uid for ref in refs}
            self._lock.wait_for(lambda: not uids & self._busy)
            for ref in refs:
                made = self.prepared[ref.uid].made if ref.uid in self.prepared else ()
                if made and self._mig is not None and (failed := self._mig.remove(made)):
                    answers[ref.uid] = self._not_unprepared(ref, failed)
                    continue
                try:
                    self._specs.remove(ref.uid)
                except OSError as error:
                    answers[ref.uid] = self._not_unprepared(ref, str(error))
                    continue
                answers[ref.uid] = ""
                if self._shares is not None:
                    self._shares.release(ref.uid)
                claim = self.prepared.pop(ref.uid, None)
                if claim is not None:
                    removed[ref.uid] = (ref, claim)
            self._busy |= set(removed)
        unsaved = self._save() if removed else ""
        with self._lock:
            for uid, (ref, claim) in removed.items():
                if unsaved:
                    self.prepared[uid] = claim
                    answers[uid] = self._not_unprepared(ref, unsaved)
                else:
                    log_event(log, logging.INFO, "claim unprepared", claim=str(ref), uid=uid)
            self._busy -= set(removed)
            self._lock.notify_all()
        self._claims.unprepared([ref.uid for ref in refs if answers[ref.uid] == ""])
        if removed and not unsaved and self._changed is not None:
            self._changed()
        return {ref.uid: answers[ref.uid] for ref in claims}

    def holders(self) -> dict[str, str]:
        """Device name -> the claim holding it ("claim namespace/name"), for the hand-over."""
        with self._lock:
            return {
                d.device_name: f"claim {c.namespace}/{c.name}" if c.namespace else f"claim {c.uid}"
                for c in self.prepared.values()
                for d in c.devices
            }

    # ---- the steps ----------------------------------------------------------------------------------

    def _read(self, ref: ClaimRef) -> tuple[list[Allocated], list[OpaqueConfig]] | ClaimAnswer:
        """The claim's results of this driver in this pool and its configs, from the API (no lock held)."""
        try:
            claim = self._api.claims().get(ref.namespace, ref.name)
            allocated = allocated_devices(claim, ref, self.pool)
            return allocated, opaque_configs(claim or {}, ref) if allocated else []
        except ClaimError as error:
            return self._refused(ref, str(error))
        except KubeError as error:
            return self._refused(ref, f"ResourceClaim {ref}: {error}")

    def _devices(self, allocated: list[Allocated]) -> dict[str, DraDevice]:
        """Each result's device, on this node and healthy (under the lock). Raises ClaimError."""
        devices: dict[str, DraDevice] = {}
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
        return devices

    def _write_spec(self, decided: _Decided, dev_nodes: Any) -> PreparedClaim | ClaimAnswer:
        """The claim's CDI spec written (no lock held: the claim is `_busy`), and what it answers."""
        ref, devices, made = decided.ref, decided.devices, tuple[MadeMig, ...]()
        try:
            if self._mig is not None:
                devices, made = self._mig.make(ref.uid, devices)
            edits = self._shares.edits(ref, decided.allocated, devices)[0] if self._shares else {}
            self._claims.apply(ref, decided.configs, decided.allocated, devices, edits)  # as made
            unique = list({d.name: d for d in devices.values()}.values())
            ids = self._specs.write(ref.uid, unique, dev_nodes, edits)
        except (ClaimError, OSError) as error:
            if self._shares is not None:
                self._shares.release(ref.uid)  # a claim not prepared holds no share
            self._claims.release(ref.uid)
            if made and self._mig is not None and (undone := self._mig.remove(made)):
                log_event(log, logging.WARNING, "MIG devices left after a failed prepare", error=undone)
            text = str(error) if isinstance(error, ClaimError) else f"ResourceClaim {ref}: {error}"
            return self._refused(ref, text)
        answer = tuple(
            PreparedDevice(
                (r.request,) if r.request else (), self.pool, r.device, (ids[devices[r.device].name],)
            )
            for r in decided.allocated
        )
        return PreparedClaim(ref.uid, ref.namespace, ref.name, answer, made)

    def _save(self) -> str:
        """Write the checkpoint of the prepared claims as they are now; "" or the error."""
        with self._save_lock:
            with self._lock:
                claims = dict(self.prepared)
            try:
                self._checkpoint.save(claims)
            except OSError as error:
                return str(error)
        return ""

    def _release(self, uids: Iterable[str]) -> None:
        with self._lock:
            self._busy -= set(uids)
            self._lock.notify_all()

    @staticmethod
    def _refused(ref: ClaimRef, message: str) -> ClaimAnswer:
        log_event(log, logging.WARNING, "claim not prepared", claim=str(ref), uid=ref.uid, error=message)
        return ClaimAnswer(error=message)

    @staticmethod
    def _not_unprepared(ref: ClaimRef, error: str) -> str:
        message = f"cannot unprepare ResourceClaim {ref}: {error}"
        log_event(log, logging.WARNING, "claim not unprepared", claim=str(ref), uid=ref.uid, error=message)
        return message

    # ---- start ----------------------------------------------------------------------------------------

    def _rebuild(self, orphans: set[str], *, everything_here: bool) -> None:
        """Claims the checkpoint does not name: those whose spec is on disk (`orphans`) and, with
        `everything_here` (no checkpoint could be read), those the API says are allocated here and
        reserved for a pod, are prepared (held). With a checkpoint read, an orphan's spec is removed
        where the API says its claim is not allocated here (written just before a crash, the kubelet
        not answered); without one, every spec is kept."""
        from_api = self._allocated_here()
        keep = orphans if from_api is None or everything_here else orphans & set(from_api)
        for uid in sorted(orphans - keep):
            try:
                self._specs.remove(uid)
                log_event(log, logging.INFO, "removed the CDI spec of a claim not prepared", uid=uid)
            except OSError as error:
                log_event(log, logging.WARNING, "cannot remove a claim's CDI spec", uid=uid, error=str(error))
        rebuilt = keep | (set(from_api or ()) - set(self.prepared) if everything_here else set())
        found = from_api or {}
        self.prepared.update({uid: self._rebuilt(uid, found.get(uid)) for uid in sorted(rebuilt)})
        if everything_here or rebuilt:
            devices = {d.device_name for uid in rebuilt for d in self.prepared[uid].devices}
            log_event(
                log,
                logging.WARNING,
                "prepared claims rebuilt from their CDI specs and the API",
                claims=len(rebuilt),
                api="unreadable" if from_api is None else "read",
                devices=",".join(sorted(devices)) or "none",
            )
            if unsaved := self._save():
                log_event(log, logging.WARNING, "cannot write the rebuilt checkpoint", error=unsaved)

    def _allocated_here(self) -> dict[str, tuple[ClaimRef, list[Allocated]]] | None:
        """The claims the API says are allocated in this pool and reserved for a pod, by UID, with
        their results here; None when they cannot be listed (said once)."""
        found: dict[str, tuple[ClaimRef, list[Allocated]]] = {}
        try:
            for obj in self._api.claims().list_all():
                if allocated_here(obj, self.pool):
                    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
                    ref = ClaimRef(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
                    try:
                        found[ref.uid] = (ref, allocated_devices(obj, ref, self.pool))
                    except ClaimError:
                        found[ref.uid] = (ref, [])
        except KubeError as error:
            log_event(
                log, logging.WARNING, "cannot list ResourceClaims; every claim spec kept", error=str(error)
            )
            return None
        return found

    def _rebuilt(self, uid: str, api: tuple[ClaimRef, list[Allocated]] | None) -> PreparedClaim:
        in_spec = self._specs.devices(uid) or []

        def cdi_ids(device: str) -> tuple[str, ...]:
            return (
                (qualified_name(CLAIM_CDI_KIND, claim_cdi_device(uid, device)),) if device in in_spec else ()
            )

        if api is None:
            devices = tuple(PreparedDevice((), self.pool, d, cdi_ids(d)) for d in in_spec)
            return PreparedClaim(uid, "", "", devices)
        ref, allocated = api
        named = {r.device for r in allocated}
        devices = tuple(
            PreparedDevice((r.request,) if r.request else (), self.pool, r.device, cdi_ids(r.device))
            for r in allocated
        ) + tuple(PreparedDevice((), self.pool, d, cdi_ids(d)) for d in in_spec if d not in named)
        return PreparedClaim(uid, ref.namespace, ref.name, devices)


def _complete(claim: PreparedClaim) -> bool:
    """Whether a prepared claim's answer is whole: a rebuilt one may lack a request or a CDI device
    (answered through the API again)."""
    return all(d.request_names and d.cdi_device_ids for d in claim.devices)


def _unique(claims: Sequence[ClaimRef]) -> list[ClaimRef]:
    """One per UID (a UID named twice in a call is one claim)."""
    return list({ref.uid: ref for ref in claims}.values())
