"""MPS for DRA claims: one `nvidia-cuda-mps-control` daemon per set of GPUs (or MIG devices), held by
the claims that use it; each claim's containers are its clients through their CDI edits.

    daemon = mps.ensure_daemon(["GPU-a"], holder=claim_uid)     # started (or found) and answering
    edits = client_edits(daemon, ClientLimits(50, {"GPU-a": 4 << 30}))
    mps.release(claim_uid)                                       # the last holder gone: it quits

- Layout under the root (`<plugin dir>/mps`, a host path): `<name>/pipe`, `<name>/log` (the daemon's
  CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY), `<name>/holders.json` (its GPUs and holders).
  `<name>` is the GPU's UUID, or `gpus-<hash of the UUIDs>` for several.
- Clients get `shm_dir` as /dev/shm (the DRA plugin's: `<MPS root>/shm`, its container's /dev/shm).
- A daemon runs with CUDA_VISIBLE_DEVICES naming its devices; whole GPUs are EXCLUSIVE_PROCESS while
  it runs and DEFAULT again when it stops or fails to start (as NVIDIA's DRA driver does).
- A GPU is under one daemon at a time: another set sharing a GPU is an error.
- `stop()` at the plugin's stop quits every daemon and keeps the holders; `resume()` at its start
  starts them again; a daemon that no longer answers is started again by the next `ensure_daemon`.
- Every failure is an MpsError, one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvdp.dirs import make_dirs
from nvdp.errors import MpsError, NvdpError
from nvdp.files import read_bounded, write_atomic
from nvdp.logs import log_event
from nvdp.mps.control import COMMAND_TIMEOUT_S, MpsControl
from nvdp.mps.layout import (
    CONTAINER_SHM,
    CONTROL_BINARY,
    PINNED_MEM_LIMIT_ENV,
    PIPE_ENV,
    THREAD_PERCENTAGE_ENV,
)
from nvdp.nvml.types import ComputeMode, ComputeModes
from nvdp.units import MIB

log = logging.getLogger(__name__)

MPS_DIR = "mps"  # under the DRA plugin's directory
HOLDERS_FILE = "holders.json"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
READY_QUERY = "get_default_active_thread_percentage"
MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class MpsDaemon:
    """A running daemon: its GPUs (UUIDs, in the order its clients number them) and directories."""

    name: str
    gpus: tuple[str, ...]
    pipe_dir: Path
    shm_dir: Path


@dataclass(frozen=True)
class ClientLimits:
    """What one claim's containers may use: a share of the GPUs' threads (percent) and pinned device
    memory per GPU (UUID -> bytes). None / absent: the daemon's default."""

    active_thread_percentage: int | None = None
    pinned_memory: Mapping[str, int] = field(default_factory=dict)


def client_edits(daemon: MpsDaemon, limits: ClientLimits) -> dict[str, Any]:
    """The CDI container edits that make a container a client of `daemon` with `limits` (pure): the
    pipe directory mounted at its own path and named by CUDA_MPS_PIPE_DIRECTORY, the shared shm at
    /dev/shm, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    (`<ordinal>=<MiB>M,...`, the ordinal being the GPU's place in `daemon.gpus`)."""
    env = [f"{PIPE_ENV}={daemon.pipe_dir}"]
    if limits.active_thread_percentage is not None:
        env.append(f"{THREAD_PERCENTAGE_ENV}={limits.active_thread_percentage}")
    pinned = [
        f"{ordinal}={limits.pinned_memory[uuid] // MIB}M"
        for ordinal, uuid in enumerate(daemon.gpus)
        if uuid in limits.pinned_memory
    ]
    if pinned:
        env.append(f"{PINNED_MEM_LIMIT_ENV}={','.join(pinned)}")
    mounts = [
        {
            "hostPath": str(daemon.pipe_dir),
            "containerPath": str(daemon.pipe_dir),
            "options": [*MOUNT_OPTIONS],
        },
        {"hostPath": str(daemon.shm_dir), "containerPath": CONTAINER_SHM, "options": [*MOUNT_OPTIONS]},
    ]
    return {"env": env, "mounts": mounts}


def daemon_name(gpus: Sequence[str]) -> str:
    if len(gpus) == 1:
        return gpus[0]
    return "gpus-" + hashlib.sha256(",".join(sorted(gpus)).encode()).hexdigest()[:12]


@dataclass
class _Running:
    daemon: MpsDaemon
    control: MpsControl
    holders: set[str]


class DraMps:
    """The DRA plugin's MPS daemons. Thread-safe; `ensure_daemon` and `release` block while a
    control command runs (each bounded by `timeout`)."""

    def __init__(
        self,
        root: Path,
        nvml: ComputeModes,
        environ: Mapping[str, str],
        *,
        binary: str = CONTROL_BINARY,
        timeout: float = COMMAND_TIMEOUT_S,
        shm_dir: Path | None = None,
    ) -> None:
        self.root = root
        self.shm_dir = shm_dir or root / "shm"  # the daemons' /dev/shm, as their clients get it
        self._nvml = nvml
        self._environ = environ
        self._binary = binary
        self._timeout = timeout
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._load()

    def ensure_daemon(self, gpus: Sequence[str], holder: str) -> MpsDaemon:
        """The daemon of `gpus` (UUIDs, in the order clients number them), started if it is not
        running or no longer answers, with `holder` (a claim UID) among its holders. Raises MpsError."""
        if not gpus:
            raise MpsError("MPS: no GPU to serve")
        name = daemon_name(gpus)
        with self._lock:
            for other in self._running.values():
                shared = sorted(set(other.daemon.gpus) & set(gpus))
                if other.daemon.name != name and shared:
                    raise MpsError(f"GPU {shared[0]} is under another MPS daemon ({other.daemon.name})")
            running = self._running.get(name)
            if running is None:
                running = self._new(name, tuple(gpus))
            if not self._answers(running):
                self._start(running)
                self._running[name] = running
            running.holders.add(holder)
            self._save(running)
            return running.daemon

    def release(self, holder: str) -> None:
        """`holder` no longer uses its daemons; one left without holders is stopped (its GPUs back to
        DEFAULT). Failures are logged: the claim is gone either way."""
        with self._lock:
            for name, running in list(self._running.items()):
                if holder not in running.holders:
                    continue
                running.holders.discard(holder)
                if running.holders:
                    self._save(running)
                    continue
                del self._running[name]
                self._stop(running)

    def resume(self) -> None:
        """At the plugin's start: every daemon an earlier run left holders for is started again
        (its claims' containers are running); a failure is logged, the next `ensure_daemon` retries."""
        with self._lock:
            for running in self._running.values():
                if self._answers(running):
                    continue
                try:
                    self._start(running)
                except MpsError as error:
                    log_event(log, logging.ERROR, "cannot start MPS daemon again", error=str(error))

    def stop(self) -> None:
        """At the plugin's stop: every daemon quits, its GPUs back to DEFAULT; the holders stay
        recorded, for `resume` at the next start."""
        with self._lock:
            for running in self._running.values():
                self._stop(running, forget=False)

    def holders(self) -> dict[str, frozenset[str]]:
        """Daemon name -> the claims holding it."""
        with self._lock:
            return {name: frozenset(r.holders) for name, r in self._running.items()}

    # ---- the steps (under the lock) -----------------------------------------------------------

    def _new(self, name: str, gpus: tuple[str, ...]) -> _Running:
        directory = self.root / name
        daemon = MpsDaemon(name, gpus, directory / "pipe", self.shm_dir)
        env = {**self._environ, VISIBLE_ENV: ",".join(gpus)}
        control = MpsControl(
            daemon.pipe_dir, directory / "log", env, binary=self._binary, timeout=self._timeout
        )
        return _Running(daemon, control, set())

    def _answers(self, running: _Running) -> bool:
        if not running.control.pipe_dir.is_dir():
            return False
        try:
            running.control.send(READY_QUERY)
        except MpsError:
            return False
        return True

    def _start(self, running: _Running) -> None:
        daemon = running.daemon
        log_event(log, logging.INFO, "starting MPS daemon", daemon=daemon.name, gpus=",".join(daemon.gpus))
        if shutil.which(self._binary, path=self._environ.get("PATH")) is None:
            raise MpsError(f"MPS: {self._binary} not found on PATH")
        try:
            make_dirs(daemon.pipe_dir)
            make_dirs(running.control.log_dir)
            make_dirs(daemon.shm_dir)
        except OSError as error:
            raise MpsError(f"MPS: cannot create {daemon.pipe_dir.parent}: {error.strerror}") from error
        self._set_modes(daemon, ComputeMode.EXCLUSIVE_PROCESS)
        try:
            running.control.start_daemon()
            running.control.send(READY_QUERY)
        except MpsError as error:
            self._set_modes(daemon, ComputeMode.DEFAULT, logged=True)
            raise MpsError(f"MPS daemon {daemon.name}: {error}") from error
        log_event(log, logging.INFO, "MPS daemon ready", daemon=daemon.name, pipe=str(daemon.pipe_dir))

    def _stop(self, running: _Running, *, forget: bool = True) -> None:
        daemon = running.daemon
        try:
            running.control.send("quit")
        except MpsError as error:
            log_event(log, logging.WARNING, "MPS daemon quit failed", daemon=daemon.name, error=str(error))
        self._set_modes(daemon, ComputeMode.DEFAULT, logged=True)
        if not forget:
            return
        try:
            (self.root / daemon.name / HOLDERS_FILE).unlink(missing_ok=True)
        except OSError as error:
            log_event(log, logging.WARNING, "cannot remove MPS holders", daemon=daemon.name, error=str(error))
        log_event(log, logging.INFO, "MPS daemon stopped", daemon=daemon.name)

    def _set_modes(self, daemon: MpsDaemon, mode: ComputeMode, *, logged: bool = False) -> None:
        for uuid in (u for u in daemon.gpus if not u.startswith("MIG-")):  # a MIG device has no mode
            try:
                self._nvml.set_compute_mode(uuid, mode)
            except NvdpError as error:
                if not logged:
                    raise MpsError(f"MPS: cannot set GPU {uuid} to {mode.name}: {error}") from error
                log_event(log, logging.WARNING, "cannot set compute mode", gpu=uuid, error=str(error))

    def _save(self, running: _Running) -> None:
        record = {"gpus": list(running.daemon.gpus), "holders": sorted(running.holders)}
        path = self.root / running.daemon.name / HOLDERS_FILE
        try:
            write_atomic(path, (json.dumps(record) + "\n").encode())
        except OSError as error:
            raise MpsError(f"MPS: cannot write {path}: {error.strerror}") from error

    def _load(self) -> None:
        """The daemons an earlier run of the plugin left, with their holders."""
        for path in sorted(self.root.glob(f"*/{HOLDERS_FILE}")):
            try:
                record = json.loads(read_bounded(path, 1 << 20))
                gpus = tuple(str(g) for g in record["gpus"])
                holders = {str(h) for h in record["holders"]}
            except (NvdpError, ValueError, KeyError, TypeError) as error:
                log_event(
                    log, logging.WARNING, "unreadable MPS holders; ignored", path=str(path), error=str(error)
                )
                continue
            if gpus and daemon_name(gpus) == path.parent.name and holders:
                running = self._new(path.parent.name, gpus)
                running.holders = holders
                self._running[running.daemon.name] = running
