"""One GPU, one API: the hand-over of a node's GPUs between `nvdp plugin` and `nvdp dra-kubelet-plugin`,
so no GPU is advertised by both, through records in `<kubelet plugins dir>/gpu.nvidia.com`.

- `served-by-<api>.json`: `{"serving": [uuid], "holds": {uuid: holder}}`, atomic; `serving` names a
  GPU before it is advertised and until after withdrawn; the device plugin's adds `"units"`
  (`nvdp.plugins.dra.node_count`). `served-by-<api>.lock` is flock'ed for the process's life.
- A record with a free lock is a stopped process's: its GPUs are not advertised, its holds stay.
- Fail closed: a record unreadable, missing beside its lock or while its process runs, or gone
  less than LOST_GRACE_S is *unknown* (no GPU taken, said once); later, holds are `prove`n
  (`nvdp.plugins.handoff.proofs`) or unknown. Changed or gone records and locks are written again.
- `settle` (`nvdp.plugins.handoff.rule`) says what an API may serve; `Handoff` re-checks a new GPU against the
  other record, so two takers both back off and retry at random, every RETRY_S.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from nvdp.base.bounded import loads_json
from nvdp.base.dir_watch import IN_CLOSE_WRITE, Watcher
from nvdp.base.dirs import DIR_MODE, make_dirs
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.base.lock_file import LockFile, is_locked
from nvdp.base.logs import log_event
from nvdp.base.timers import TIMERS as T
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.handoff.proofs import Proven, Prover, device_plugin_holds
from nvdp.plugins.handoff.rule import (
    API_WORDS,
    DEVICE_PLUGIN,
    DRA,
    UNKNOWN_HOLDER,
    Record,
    Settled,
    settle,
    unit_count,
)

log = logging.getLogger(__name__)

# Settings of nvdp.base.timers, production's 5 s (randomised by half), 30 s, 30 s: see above and `Timers`.
RETRY_S, SWITCH_GRACE_S, LOST_GRACE_S = T.handoff_retry, T.handoff_switch_grace, T.handoff_lost_grace
LOCK_TRIES = 50  # the other side's liveness check holds the lock for microseconds
LOCK_TRY_WAIT_S = 0.02
MAX_RECORD_BYTES = 1 << 20


class Handoff:
    """This process's side for `api` (DEVICE_PLUGIN or DRA), its records in `directory`; `prove`: what
    proves a stopped other side's holds (default: PodResources for DRA, nothing for the device plugin).
    The DRA driver makes its directory when missing; the device plugin only where its parent is (else
    no DRA driver can run here: no records, looked for again at each `settle`)."""

    def __init__(self, api: str, directory: Path, prove: Prover | None = None) -> None:
        self.api = api
        self._prove_other = prove or (device_plugin_holds if api == DRA else None)
        self.other_api = DRA if api == DEVICE_PLUGIN else DEVICE_PLUGIN
        self.directory = directory
        self._lock = LockFile(self._path(api, "lock"))
        self._joined = False  # the directory was there once: lock taken (or tried), record written
        self._lock_said = False
        self._serving: frozenset[str] = frozenset()
        self._holds: dict[str, str] = {}
        self._units: dict[str, int] = {}  # resource name -> devices advertised (the device plugin's)
        self._last = Settled(frozenset())
        self.other = Record()  # the other API's record as last read by settle
        self._retry_at: float | None = None
        self._other_seen: tuple[int, int] | None = None
        self._unreadable_said = False
        self._unproven_said = False
        self._written = ""  # the record as last written by this process
        self._written_id: tuple[int, int] | None = None  # its (inode, mtime) once written
        self._other_last_seen: float | None = None  # time.monotonic() the other record was last there
        self._advertised_since: dict[str, float] = {}  # GPUs waiting only for the other to withdraw
        self._gpus: Sequence[GpuInfo] = ()  # the node's, as of the last settle (for the proofs)

    # ---- the records ------------------------------------------------------------------------------
    def _path(self, api: str, suffix: str) -> Path:
        return self.directory / f"served-by-{api}.{suffix}"

    def _usable(self) -> bool:
        """The directory is there (made when ours) and our lock is taken."""
        if not self.directory.is_dir():
            try:
                if self.api == DRA:
                    make_dirs(self.directory)
                else:
                    self.directory.mkdir(mode=DIR_MODE)
            except FileNotFoundError:
                return False
            except FileExistsError:
                pass  # the other side made it first
            except OSError as error:
                self._say_lock(f"cannot make the directory: {error.strerror or error}")
                return False
            if not self.directory.is_dir():
                self._say_lock("cannot make the directory: another file stands at its path")
                return False
        if not self._joined:
            self._joined = True
            self._take_lock()
            self._holds = dict(self._read(self.api).holds)  # a previous run's, until ours are known
            self._write(self._serving)  # the directory just appeared: say at once what is served
        return True

    def _take_lock(self) -> None:
        try:
            if self._lock.acquire(tries=LOCK_TRIES, every_s=LOCK_TRY_WAIT_S) is None:
                return
        except OSError as error:
            self._say_lock(f"cannot open the lock: {error.strerror or error}")
            return
        self._say_lock(f"another process of {API_WORDS[self.api]} holds the lock")

    def _say_lock(self, problem: str) -> None:
        if not self._lock_said:
            log_event(
                log,
                logging.WARNING,
                "GPU hand-over record not locked; the other API may take this API's GPUs while it runs",
                directory=str(self.directory),
                problem=problem,
            )
            self._lock_said = True

    def _lock_replaced(self) -> bool:
        """Our lock file is gone or another file stands at its path (a cleaned directory)."""
        return self._lock.taken and not self._lock.held

    def _own_files_changed(self) -> bool:
        """Our record or lock is not what this process left (removed, replaced, edited)."""
        return bool(self._written) and (
            self._lock_replaced() or _stat(self._path(self.api, "json")) != self._written_id
        )

    def _restore_own_files(self) -> None:
        where = str(self.directory)
        if self._lock_replaced():
            log_event(
                log, logging.WARNING, "GPU hand-over lock removed or replaced; locking again", directory=where
            )
            self.close()
            with contextlib.suppress(OSError):
                self._path(self.api, "lock").unlink()  # ours to make: whatever stands there goes
            self._lock_said = False
            self._take_lock()
        if self._written and _stat(self._path(self.api, "json")) != self._written_id:
            log_event(log, logging.WARNING, "GPU hand-over record changed; written again", directory=where)
            self._written = ""
            self._write(self._serving)

    def read_other(self) -> Record:
        """The other API's record; unknown (said once) when it cannot be trusted."""
        path = self._path(self.other_api, "json")
        now = time.monotonic()
        if os.path.lexists(path):
            self._other_last_seen = now
            return self._read(self.other_api)
        alive = self._alive(self.other_api)
        lock_there = os.path.lexists(self._path(self.other_api, "lock"))
        lost = self._other_last_seen is not None and now - self._other_last_seen < LOST_GRACE_S
        if alive or lock_there or lost:
            self._say_unreadable(path, "missing" if not lost or lock_there else "missing with its lock")
            return Record(alive=alive, known=False)
        if self._other_last_seen is None:
            return Record()  # never there while this process ran
        proven = self._prove()
        if isinstance(proven, str):
            if not self._unproven_said:
                log_event(
                    log,
                    logging.WARNING,
                    "GPU hand-over record gone with its lock and the other API's holds cannot be proven;"
                    " no GPU is taken from it",
                    path=str(path),
                    error=proven,
                )
                self._unproven_said = True
            return Record(known=False)
        self._unproven_said = False
        return Record(holds=proven)

    def _prove(self) -> Proven:
        if self._prove_other is None:
            return "nothing here can prove the other API's holds"
        return self._prove_other(self.directory, self._gpus)

    def _read(self, api: str) -> Record:
        path = self._path(api, "json")
        if not os.path.lexists(path):
            return Record(alive=self._alive(api))
        try:
            if path.is_symlink():
                raise UnreadableFile(str(path), "is a symbolic link")
            data = loads_json(read_bounded(path, MAX_RECORD_BYTES), max_bytes=MAX_RECORD_BYTES)
            serving = frozenset(str(u) for u in data["serving"])
            holds = {str(u): str(h) for u, h in dict(data["holds"]).items()}
            units = {str(name): unit_count(n) for name, n in dict(data.get("units") or {}).items()}
        except (UnreadableFile, OSError, ValueError, KeyError, TypeError) as error:
            self._say_unreadable(path, str(error))
            return Record(alive=self._alive(api), known=False)
        self._unreadable_said = False
        return Record(serving, holds, self._alive(api), units=units)

    def _say_unreadable(self, path: Path, error: str) -> None:
        if not self._unreadable_said:
            log_event(
                log,
                logging.WARNING,
                "GPU hand-over record unreadable; no GPU is taken from the other API until it is readable",
                path=str(path),
                error=error,
            )
            self._unreadable_said = True

    def _alive(self, api: str) -> bool:
        """Whether `api`'s process holds its lock (a shared lock taken here would wait); a lock file
        replaced by a symlink counts as held (fail closed: what that side advertises stays its)."""
        try:
            return is_locked(self._path(api, "lock"))
        except OSError as error:
            return error.errno == errno.ELOOP

    def _write(self, serving: frozenset[str]) -> None:
        """The record, when it says something new (the other side is woken by each write)."""
        said: dict[str, object] = {"serving": sorted(serving), "holds": dict(sorted(self._holds.items()))}
        if self._units:
            said["units"] = dict(sorted(self._units.items()))
        body = json.dumps(said) + "\n"
        if body == self._written:
            return
        try:
            path = self._path(self.api, "json")
            written = write_atomic(path, body.encode(), 0o644)  # its id, even if it is removed at once
            self._written, self._written_id = body, (written.st_ino, written.st_mtime_ns)
        except OSError as error:
            log_event(
                log,
                logging.WARNING,
                "cannot write the GPU hand-over record",
                directory=str(self.directory),
                error=str(error),
            )

    # ---- the protocol ------------------------------------------------------------------------------
    def settle(
        self, mine: frozenset[str], holds: Mapping[str, str] | None, gpus: Sequence[GpuInfo] = ()
    ) -> Settled:
        """What this API may serve now, given the GPUs the config gives it and what its pods hold
        (None: not known yet; a previous run's record stands for it); `gpus`: the node's (a stopped
        side's holds are proven on them). The caller advertises exactly `serve`, then calls `served`."""
        self._gpus = gpus
        usable = self._usable()
        if holds is not None:
            self._holds = dict(holds)
        if usable:
            self._restore_own_files()
        if not usable:
            # No directory: no DRA driver here, all the config's GPUs are this API's; but once the other
            # API's record was seen in this run, an unusable directory changes nothing that is served.
            self._last = Settled(mine if self._other_last_seen is None else self._serving)
            self._retry_at = None
            return self._last
        self._other_seen = self._stat_other()
        other = self.other = self.read_other()
        settled = settle(mine, self._serving, self._holds, other)
        gained = settled.serve - self._serving
        self._write(self._serving | settled.serve)  # named before advertised; the holds as they are
        if gained:
            again = self.other = self.read_other()
            lost = {u for u in gained if u in again.holds or (again.alive and u in again.serving)}
            if lost:
                waiting = {**settled.waiting, **{u: again.holds.get(u, "") for u in sorted(lost)}}
                settled = Settled(settled.serve - lost, settled.kept, waiting)
        self._last = settled
        now = time.monotonic()
        self._advertised_since = {
            u: self._advertised_since.get(u, now) for u, holder in settled.waiting.items() if not holder
        }
        self._retry_at = (
            time.monotonic() + RETRY_S * random.uniform(0.5, 1.5) if settled.kept or settled.waiting else None
        )
        return settled

    def served(self, serving: frozenset[str], units: Mapping[str, int] | None = None) -> None:
        """The API advertises exactly `serving` now (after withdrawing what it no longer serves); the
        device plugin says with `units` how many devices each of its resources lists now (a resource
        listed before and not now: 0)."""
        self._serving = serving
        if units is not None:
            self._units = {**dict.fromkeys(self._units, 0), **units}
        if self.directory.is_dir():
            self._write(serving)

    def hold(self, holds: Mapping[str, str]) -> None:
        """What this API's claims or pods hold now, written at once (at stop, once no request can come
        in: the record a stopped process leaves names what it holds then, not at its last settle)."""
        self._holds = dict(holds)
        if self._joined and self.directory.is_dir():
            self._write(self._serving)

    def own_record(self) -> tuple[Record, Path, Path]:
        """This API's record as on disk, its path and its lock's (`nvdp.plugins.uninstall` removes them)."""
        return self._read(self.api), self._path(self.api, "json"), self._path(self.api, "lock")

    def close(self) -> None:
        self._lock.close()

    # ---- when to settle again -----------------------------------------------------------------------
    def retry_in(self) -> float | None:
        """Seconds until a GPU that waits or is kept is looked at again; None while none does."""
        return None if self._retry_at is None else max(0.0, self._retry_at - time.monotonic())

    def due(self) -> bool:
        """The retry is due, the directory appeared, or the other API's record changed since the last
        look."""
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            return True
        if not self.directory.is_dir():
            return self._joined and self.api == DRA  # our own directory went: made again at settle
        return not self._joined or self._stat_other() != self._other_seen or self._own_files_changed()

    def _stat_other(self) -> tuple[int, int] | None:
        return _stat(self._path(self.other_api, "json"))

    def watch(self, watcher: Watcher) -> None:
        """Keep the records' directory in `watcher`'s inotify watch (the other record's writes wake it),
        or while it is missing the nearest of its two parents there is (it appears with the DRA driver);
        a record written in place (not replaced) wakes it too."""
        if self.directory.is_dir():
            watcher.add(self.directory, IN_CLOSE_WRITE)
            return
        for directory in (self.directory.parent, self.directory.parent.parent):
            if directory.is_dir():  # only the next component's arrival wakes it
                watcher.add(directory, names=frozenset({self.directory.relative_to(directory).parts[0]}))
                return

    # ---- what to say ---------------------------------------------------------------------------------
    def misfits(self, labels: Mapping[str, str]) -> tuple[Misfit, ...]:
        """The GPUs of the last settle that wait or are kept, as misfits (`labels`: uuid -> "GPU 3")."""
        mine, other = API_WORDS[self.api], API_WORDS[self.other_api]
        found: list[Misfit] = []
        now = time.monotonic()
        for uuid, holder in self._last.waiting.items():
            if not holder and now - self._advertised_since.get(uuid, now) < SWITCH_GRACE_S:
                continue  # the other side is reading the same switch: a moment, not a misfit
            name = labels.get(uuid, uuid)
            why = (
                f"{other}'s hand-over record cannot be read (it may hold the GPU)"
                if holder == UNKNOWN_HOLDER
                else f"{holder} holds it through {other}"
                if holder
                else f"{other} still advertises it"
            )
            found.append(
                Misfit(
                    "GpuHeldByOtherApi",
                    name,
                    f"{name} ({uuid}): the config gives it to {mine}, but {why}; served here once it is free",
                )
            )
        for uuid, holder in self._last.kept.items():
            name = labels.get(uuid, uuid)
            found.append(
                Misfit(
                    "GpuHandoverDeferred",
                    name,
                    f"{name} ({uuid}): the config gives it to {other}, but {holder} holds it through {mine};"
                    " kept here until it is released",
                )
            )
        return tuple(found)


def _stat(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the file at `path` itself (a symlink is not followed); None when missing."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return (found.st_ino, found.st_mtime_ns)
