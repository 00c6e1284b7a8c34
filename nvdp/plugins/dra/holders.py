"""Which pods hold the DRA plugin's devices: each prepared claim's `status.reservedFor`, read in the
background, so a health transition names its claims and pods (`nvdp.node.health.router`, `pod_events`).

- `touch`: every NodePrepareResources queues a read of its claims; `forget`: unprepare drops one.
- `changed` (a device changed health) reads every prepared claim again; so does the first `publish`.
- `held` answers from memory and never waits (the health path calls it).
- The reads run on one thread; a full queue drops (the next touch reads again).
- After each batch, and when `publish()` asks, it writes the allocations file
  (`nvdp.plugins.dra.allocations`) if changed; `close()` removes it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from nvdp.base.errors import KubeError
from nvdp.base.logs import log_event
from nvdp.plugins.dra.allocations import AllocationsFile, dra_devices
from nvdp.plugins.dra.checkpoint import PreparedClaim
from nvdp.plugins.dra.claims import ClaimRef
from nvdp.plugins.dra.cluster import ResourceApi
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.node_state import NodeState
from nvdp.plugins.ledger.types import Holding

log = logging.getLogger(__name__)

MAX_QUEUE = 1024
_PUBLISH = "publish"  # a queue entry: write the allocations file
Pod = tuple[str, str | None]  # (name, uid) in the claim's namespace


def reserved_pods(claim: object) -> tuple[Pod, ...]:
    """The pods a ResourceClaim (as the API has it) is reserved for (pure)."""
    status = claim.get("status") if isinstance(claim, Mapping) else None
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    pods: dict[Pod, None] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or entry.get("resource") != "pods" or entry.get("apiGroup"):
            continue
        name, uid = entry.get("name"), entry.get("uid")
        if isinstance(name, str) and name:
            pods[(name, uid if isinstance(uid, str) and uid else None)] = None
    return tuple(pods)


class ClaimHolders:
    """`prepared()`: the preparer's claims by UID now; `state`: this node's DRA devices and their
    health; `shares()`: device name -> the sharing a claim's config applied; `file`: where the
    allocations file goes (None: none)."""

    def __init__(
        self,
        api: ResourceApi,
        prepared: Callable[[], Mapping[str, PreparedClaim]],
        state: NodeState,
        shares: Callable[[], Mapping[str, str]] = dict,
        file: Path | None = None,
    ) -> None:
        self._api = api
        self._prepared = prepared
        self._devices = state.devices
        self._state = state
        self._shares = shares
        self._file = AllocationsFile(file, self.entries) if file is not None else None
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[Pod, ...]] = {}  # claim UID -> its pods, as last read
        self._pending: set[str] = set()
        self._published = False
        self._queue: queue.Queue[ClaimRef | str | None] = queue.Queue(MAX_QUEUE)
        self._thread = threading.Thread(target=self._run, name="dra-claim-holders", daemon=True)
        self._thread.start()

    # ---- the preparer's side --------------------------------------------------------------------------

    def touch(self, refs: Iterable[ClaimRef]) -> None:
        """Read these claims' pods again (soon); never blocks."""
        for ref in refs:
            if not ref.namespace or not ref.name:
                continue
            with self._lock:
                if ref.uid in self._pending:
                    continue
                self._pending.add(ref.uid)
            try:
                self._queue.put_nowait(ref)
            except queue.Full:
                with self._lock:
                    self._pending.discard(ref.uid)

    def forget(self, uids: Iterable[str]) -> None:
        with self._lock:
            for uid in uids:
                self._pods.pop(uid, None)

    def pods(self, uid: str) -> tuple[Pod, ...]:
        with self._lock:
            return self._pods.get(uid, ())

    # ---- the health router's side (`nvdp.node.health.router.AllocationLookup`) -----------------------------

    def held(self, resource: str, device_ids: Collection[str]) -> list[Holding]:
        """The pods holding the devices of these GPU / MIG UUIDs, through their prepared claims."""
        if resource != DRIVER_NAME:
            return []
        wanted = set(device_ids)
        names = {n for d in self._devices() if d.uuid in wanted for n in (d.name, d.former_name) if n}
        with self._lock:
            pods = dict(self._pods)
        found: dict[Holding, None] = {}
        for claim in self._prepared().values():
            for device in (d for d in claim.devices if d.device_name in names):
                for pod, uid in pods.get(claim.uid, ()):
                    holding = Holding(
                        DRIVER_NAME,
                        device.device_name,
                        claim.namespace,
                        pod,
                        "",
                        uid,
                        claim=f"{claim.namespace}/{claim.name}",
                    )
                    found[holding] = None
        return list(found)

    def changed(self) -> None:
        """A device changed health: read every prepared claim's pods again (the others forgotten)."""
        prepared = self._prepared()
        with self._lock:
            self._pods = {uid: pods for uid, pods in self._pods.items() if uid in prepared}
        self.touch(ClaimRef(c.namespace, c.name, c.uid) for c in prepared.values())

    def entries(self) -> list[dict[str, Any]]:
        """The allocations file's devices now."""
        return dra_devices(self._devices(), self._state.health(), self._prepared(), self.pods, self._shares())

    def publish(self) -> None:
        """Write the allocations file (soon, if it changed); never blocks. The first call also reads
        the pods of the claims prepared before (a restart)."""
        if not self._published:
            self._published = True
            self.changed()
        try:
            self._queue.put_nowait(_PUBLISH)
        except queue.Full:
            pass

    def close(self, timeout: float = 1.0) -> None:
        """Stop the reads (within `timeout`) and remove the allocations file."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._file is not None:
            self._file.remove()

    def _run(self) -> None:
        while True:
            ref = self._queue.get()
            try:
                if ref is None:
                    return
                if isinstance(ref, ClaimRef):
                    with self._lock:
                        self._pending.discard(ref.uid)
                    self._read(ref)
                if self._file is not None and self._queue.empty():
                    self._file.write()
            finally:
                self._queue.task_done()

    def _read(self, ref: ClaimRef) -> None:
        try:
            claim: Any = self._api.claims().get(ref.namespace, ref.name)
        except KubeError as error:
            log_event(log, logging.DEBUG, "cannot read a claim's pods", claim=str(ref), error=str(error))
            return
        metadata = claim.get("metadata") if isinstance(claim, Mapping) else None
        if not isinstance(metadata, Mapping) or metadata.get("uid") != ref.uid:
            return
        pods = reserved_pods(claim)
        with self._lock:
            self._pods[ref.uid] = pods  # `held` names only the prepared claims' pods
