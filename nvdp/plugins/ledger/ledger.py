"""The allocation ledger: which container holds which device, read from the kubelet's PodResources
API when something may have changed, and kept in memory for whoever asks.

- A read is one `List` on the local socket, plus the kubelet's device checkpoint for pod UIDs.
- Reads happen after each Allocate answered (at AFTER_ALLOCATE_S; a burst shares them), after each
  health change (`changed`), on a page's demand, and on a slow resync (RESYNC_S); no other timer.
- A page asks for an answer at most so old (`recent`: /allocations, /metrics) and waits at most
  PAGE_WAIT_S, not at all while a read is under way: a hung kubelet costs a page nothing, which
  then shows the last read (`read_at` says how old).
- The health path's questions (`held`) are answered from memory, never waiting for a read.
- A missing socket (an old kubelet, the feature gate off, a plugin run by hand) is said once at
  start and gets empty answers; reading starts when the socket appears.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from nvdp.base.errors import NvdpError, PodResourcesUnavailable
from nvdp.base.logs import log_event
from nvdp.base.units import format_go_duration
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.ledger.checkpoint import CHECKPOINT_FILE, CheckpointUids, with_uids
from nvdp.plugins.ledger.locate import locate
from nvdp.plugins.ledger.podresources import PodResourcesClient, pod_resources_socket
from nvdp.plugins.ledger.types import Holding, LedgerSnapshot

log = logging.getLogger(__name__)

RESYNC_S = 60.0  # a read at least this often, to let go of pods that ended
AFTER_ALLOCATE_S = (0.2, 1.0, 3.0)  # reads after an Allocate, from its answer
RESOURCE_PREFIX = "nvidia.com/"
STOP_WAIT_S = 5.0
PAGE_WAIT_S = 0.25  # a page waits at most this long for the read it asked for

Reader = Callable[[str], list[Holding]]  # resource prefix -> holdings (PodResourcesClient.list)


class AllocationLedger:
    """The kubelet's record of the node's device holdings. Thread-safe; `start` reads in a thread of
    its own until the idempotent `stop`. `reader` replaces the PodResources client and `clock` the
    monotonic clock that reads are due by (tests)."""

    def __init__(
        self,
        socket_path: Path,
        checkpoint: Path | None = None,
        *,
        resync: float = RESYNC_S,
        reader: Reader | None = None,
        after_allocate: tuple[float, ...] = AFTER_ALLOCATE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.socket_path = socket_path
        self._client = PodResourcesClient(socket_path)
        self._reader = reader or self._client.list
        self._checkpoint = CheckpointUids(checkpoint) if checkpoint is not None else None
        self._resync = resync
        self._after_allocate = after_allocate
        self._lock = threading.Lock()  # guards the snapshot and the reads asked for
        self._read_done = threading.Condition(self._lock)
        self._reading = threading.Lock()  # one read at a time
        self._snapshot = LedgerSnapshot(str(socket_path))
        self._due: list[float] = []  # clock times of the reads asked for
        self._attempted: float | None = None  # clock time of the last read
        self._reading_since: float | None = None  # clock time of the read under way
        self._completed: float | None = None  # clock time the last finished read began
        self._next_resync = 0.0  # clock time of the next read on the slow timer
        self._answering: bool | None = None  # the last read worked (None: none yet)
        self._uid_problem: str | None = None  # the checkpoint's problem, as last said
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of_kubelet(cls, kubelet_socket: Path) -> AllocationLedger:
        """The ledger of the kubelet whose registration socket is `kubelet_socket`: its PodResources
        socket, its device checkpoint beside the registration socket."""
        return cls(pod_resources_socket(kubelet_socket), kubelet_socket.parent / CHECKPOINT_FILE)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._next_resync = self._clock() + self._resync
        if os.path.exists(self.socket_path):
            self._ask(0.0)
        else:
            log_event(
                log,
                logging.INFO,
                "no PodResources socket: pods holding devices are unknown until the kubelet serves it",
                socket=str(self.socket_path),
            )
        self._thread = threading.Thread(target=self._run, name="nvdp-ledger", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_WAIT_S)
        self._client.close()

    # ---- what may have changed the record (any thread; never blocks) ---------------------------
    def allocated(self) -> None:
        """The plugin answered an Allocate: read once the kubelet has recorded it."""
        now = self._clock()
        with self._lock:
            first = now + self._after_allocate[0]
            self._due = [t for t in self._due if t <= first] + [now + d for d in self._after_allocate]
        self._wake.set()

    def changed(self) -> None:
        """A device changed health: read now, so what follows names today's holders."""
        self._ask(0.0)

    def _ask(self, delay: float) -> None:
        with self._lock:
            self._due.append(self._clock() + delay)
        self._wake.set()

    # ---- questions ----------------------------------------------------------------------------
    def snapshot(self) -> LedgerSnapshot:
        """The record as last read (from memory)."""
        with self._lock:
            return self._snapshot

    def held(self, resource: str, device_ids: Collection[str]) -> list[Holding]:
        """Who holds these devices of `resource`, from memory (for the health path)."""
        return self.snapshot().held(resource, device_ids)

    def gpu_holders(self, gpus: Sequence[GpuInfo], fresh: bool = False) -> dict[str, str] | None:
        """GPU uuid -> a pod holding one of its devices ("pod namespace/name"), for the hand-over with
        the DRA driver (`nvdp.plugins.handoff`): read now when `fresh` (a GPU would be withdrawn: a pod that
        got it a moment ago must count), else from memory (and a read is asked for). None while the
        kubelet's record is not known (its socket is there but has not answered)."""
        if fresh:
            snapshot = self.fresh(0.0)
        else:
            snapshot = self.snapshot()
            self._ask(0.0)
        if (snapshot.read_at is None or snapshot.problem) and os.path.exists(self.socket_path):
            return None
        holders: dict[str, str] = {}
        for holding in snapshot.holdings:
            where = locate(holding.device_id, {}, gpus)
            if where is not None:
                holders.setdefault(where.gpu_uuid, f"pod {holding.pod_key}")
        return holders

    def fresh(self, max_age: float) -> LedgerSnapshot:
        """The record read at most `max_age` seconds ago: read now when the last read is older."""
        with self._reading:
            last = self._attempted
            if last is None or self._clock() - last > max_age:
                self._read_locked()
        return self.snapshot()

    def recent(self, max_age: float, wait: float = PAGE_WAIT_S) -> LedgerSnapshot:
        """The record for a page: from memory when read at most `max_age` seconds ago; else a read is
        asked of the ledger's thread and waited for at most `wait` seconds, or not at all while a read
        is under way (the last read is served). Reads inline before `start`."""
        if self._thread is None:
            return self.fresh(max_age)
        asked = self._clock()
        with self._lock:
            done = self._completed
            if self._reading_since is None and (done is None or asked - done > max_age):
                self._due.append(asked)
                self._wake.set()
                self._read_done.wait_for(lambda: (self._completed or -1.0) >= asked, wait)
            return self._snapshot

    # ---- reading ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            now = self._clock()
            with self._lock:
                due = now >= self._next_resync or any(t <= now for t in self._due)
                self._due = [t for t in self._due if t > now]
            if due:
                try:
                    self.fresh(0.0)
                except Exception:  # a bug: said with its traceback; the ledger goes on
                    log.exception("allocation ledger read failed")
            now = self._clock()
            with self._lock:
                wait = min([self._next_resync - now, *(t - now for t in self._due)])
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()

    def _read_locked(self) -> None:
        started = self._attempted = self._clock()
        with self._lock:
            self._next_resync = started + self._resync
            self._reading_since = started
        try:
            self._read_and_keep()
        finally:
            with self._lock:
                self._reading_since, self._completed = None, started
                self._read_done.notify_all()

    def _read_and_keep(self) -> None:
        try:
            holdings = self._reader(RESOURCE_PREFIX)
        except PodResourcesUnavailable as error:
            self._unanswered(str(error))
            return
        if self._checkpoint is not None and holdings:
            holdings = with_uids(holdings, self._uids(self._checkpoint))
        snapshot = LedgerSnapshot(str(self.socket_path), tuple(holdings), time.time())
        with self._lock:
            self._snapshot = snapshot
        if self._answering is not True:
            log_event(
                log,
                logging.INFO,
                "reading pod allocations from the kubelet",
                socket=str(self.socket_path),
                held=len(holdings),
                resync=format_go_duration(self._resync),
            )
        self._answering = True

    def _unanswered(self, problem: str) -> None:
        with self._lock:
            old = self._snapshot
            self._snapshot = LedgerSnapshot(old.source, old.holdings, old.read_at, problem)
        if self._answering:
            log_event(
                log,
                logging.WARNING,
                "PodResources API not answering; keeping the allocations read last",
                error=problem,
            )
        self._answering = False

    def _uids(self, checkpoint: CheckpointUids) -> dict[tuple[str, str, str], str]:
        """The pod UIDs of the kubelet's checkpoint; {} (said once per problem) when unreadable."""
        try:
            uids = checkpoint.read()
        except NvdpError as error:
            if str(error) != self._uid_problem:
                log_event(
                    log,
                    logging.INFO,
                    "pod UIDs unknown: cannot read the kubelet's device checkpoint",
                    error=str(error),
                )
            self._uid_problem = str(error)
            return {}
        self._uid_problem = None
        return uids
