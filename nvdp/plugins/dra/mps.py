"""MPS for the DRA plugin: one `nvidia-cuda-mps-control` daemon per set of GPUs (or MIG devices), held
by the claims whose containers are its clients. Both ways a claim gets MPS go through it: a share of a
GPU shared by capacity (`nvdp.plugins.dra.capacity_mps`, one daemon per GPU) and a claim's opaque MPS config
(`nvdp.plugins.dra.claim_sharing`, one daemon per set of devices a config names).

    daemon = mps.ensure_daemon(["GPU-a"], holder=claim_uid)   # started (or found) and ready
    edits = client_edits(daemon, ClientLimits(50, {"GPU-a": 4 << 30}))
    mps.release(claim_uid)                                     # the last holder gone: it quits

Layout under the MPS root (`flags.mpsRoot` / MPS_ROOT, else /run/nvidia/mps; a host path):
- `gpu.nvidia.com/<name>/` is the daemon's resource directory as `nvdp.node.mps.layout` lays it out for
  `nvdp mps-control-daemon`: `pipe` and `log` (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY), the
  ready marker `.started`, the status `.status`; beside them `holders.json` (its devices, its holders).
  `<name>` is the GPU's UUID, or `gpus-<hash of the UUIDs>` for several.
- `shm`: the clients' /dev/shm (the plugin container's own /dev/shm, mounted there by the chart).

Rules:
- Each daemon runs under `nvdp.node.mps.controller.MpsController` (a thread of its own): its GPUs
  EXCLUSIVE_PROCESS while it runs (a MIG device has no mode), the ready marker once it answers, a
  health query every `health_interval` and a restart with backoff when it fails, `quit` and DEFAULT
  at its stop. A daemon an earlier run left answering on the pipe is kept, not replaced.
- `ensure_daemon` of a daemon whose marker is there returns at once (no control command runs); else
  it starts the controller if none runs and waits for the marker, the reason the status file gives,
  or `ready_timeout`. A failure drops the holder; a daemon left without holders stops.
- A GPU is under one daemon at a time: another set with one of its GPUs is an error.
- The holders record is written (atomically) at every change, also when the last holder goes. At
  start it is read bounded (RECORD_MAX_BYTES, not through a link), and trusted only when its devices
  name its directory and every entry is a bounded plain identifier. A record that is missing while
  the pipe directory is there, or that fails a check, says nothing of who uses the daemon: one
  WARNING, and that daemon is never stopped by a release (only with the plugin).
- `stop()` (the plugin's stop) quits every daemon and keeps the records; `resume()` (the next start,
  once NVML is up) starts those with holders again, holders that are no prepared claim dropped.
- A simulated node without `nvidia-cuda-mps-control` (`nvdp simulate --api dra`) runs none: the
  ready marker is written instead, as `nvdp.node.mps.simulated` does for the device plugin.
- Every failure is an MpsError, one line.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from nvdp.base.dirs import make_dirs
from nvdp.base.errors import MpsError, NvdpError
from nvdp.base.logs import log_event
from nvdp.base.units import MIB
from nvdp.node.cdi.edits import IPC_MOUNT_OPTIONS
from nvdp.node.mps.controller import MpsController, _Daemon
from nvdp.node.mps.layout import (
    CONTAINER_SHM,
    CONTROL_BINARY,
    PINNED_MEM_LIMIT_ENV,
    PIPE_ENV,
    THREAD_PERCENTAGE_ENV,
    MpsRoot,
)
from nvdp.node.mps.plan import DaemonPlan, GpuShare
from nvdp.node.mps.status import read_status, remove_status
from nvdp.node.nvml.types import ComputeMode, ComputeModes
from nvdp.plugins.dra.mps_record import HOLDERS_FILE, daemon_name, read_record, write_record
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.options import DraSettings

log = logging.getLogger(__name__)

DEFAULT_MPS_ROOT = "/run/nvidia/mps"  # NVIDIA's
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
READY_TIMEOUT_S = 30.0  # a daemon's start, as a claim waits for it
READY_POLL_S = 0.005
STOP_TIMEOUT_S = 10.0  # a controller's stop (its `quit` is bounded by the controller)
STATUS_SLACK_NS = 50_000_000  # file times lag the clock by a tick: a status this much older is fresh


@dataclass(frozen=True)
class MpsDaemon:
    """A daemon: its GPUs (UUIDs, in the order its clients number them) and directories."""

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
    /dev/shm, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT keyed by GPU UUID (`<uuid>=<MiB>M,...`, as NVIDIA's
    DRA driver keys it) and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE."""
    env = [f"{PIPE_ENV}={daemon.pipe_dir}"]
    pinned = [
        f"{uuid}={limits.pinned_memory[uuid] // MIB}M" for uuid in daemon.gpus if uuid in limits.pinned_memory
    ]
    if pinned:
        env.append(f"{PINNED_MEM_LIMIT_ENV}={','.join(pinned)}")
    if limits.active_thread_percentage is not None:
        env.append(f"{THREAD_PERCENTAGE_ENV}={limits.active_thread_percentage}")
    pipe, options = str(daemon.pipe_dir), list(IPC_MOUNT_OPTIONS)
    mounts = [
        {"hostPath": pipe, "containerPath": pipe, "options": options},
        {"hostPath": str(daemon.shm_dir), "containerPath": CONTAINER_SHM, "options": list(options)},
    ]
    return {"env": env, "mounts": mounts}


def mps_root(configured: str | None) -> MpsRoot:
    """The MPS root of the DRA plugin's daemons: `flags.mpsRoot` / MPS_ROOT, else NVIDIA's."""
    return MpsRoot(Path(configured or DEFAULT_MPS_ROOT))


class _WholeGpus:
    """Compute modes of whole GPUs only: a MIG device has none (its GPU's is left alone)."""

    def __init__(self, nvml: ComputeModes) -> None:
        self._nvml = nvml

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        if gpu_uuid.startswith("MIG-"):
            return ComputeMode.EXCLUSIVE_PROCESS
        return self._nvml.compute_mode(gpu_uuid)

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        if not gpu_uuid.startswith("MIG-"):
            self._nvml.set_compute_mode(gpu_uuid, mode)


class _Keeping(MpsController):
    """A daemon that an earlier run left answering on the pipe is kept: its clients may be running."""

    def _earlier_daemon_answers(self, daemon: _Daemon) -> None:
        log_event(
            log, logging.INFO, "MPS daemon of an earlier run answers; kept", resource=daemon.plan.resource
        )


@dataclass
class _Running:
    daemon: MpsDaemon
    holders: set[str]
    kept: bool = False  # who uses it is unknown (no trusted record): never stopped by a release
    controller: MpsController | None = None
    thread: threading.Thread | None = None


class DraMps:
    """The DRA plugin's MPS daemons. Thread-safe; `ensure_daemon` waits for a daemon's start and
    `release` for its stop (both bounded)."""

    def __init__(
        self,
        root: MpsRoot,
        nvml: ComputeModes,
        environ: Mapping[str, str],
        *,
        simulated: bool = False,
        ready_timeout: float = READY_TIMEOUT_S,
        health_interval: float = 5.0,
        binary: str = CONTROL_BINARY,
    ) -> None:
        self.root = root
        self._nvml = _WholeGpus(nvml)
        self._environ = dict(environ)
        self._simulated = simulated
        self._ready_timeout = ready_timeout
        self._health_interval = health_interval
        self._binary = binary
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._untrusted: set[str] = set()  # daemon names whose record could not be trusted
        self._stopped = False
        self._load()

    @staticmethod
    def for_node(nvml: object, settings: DraSettings, environ: Mapping[str, str]) -> DraMps:
        """In the settings' MPS root; a simulated node without the control binary on PATH marks its
        daemons ready instead."""
        path = os.pathsep.join(os.get_exec_path(dict(environ)))
        missing = shutil.which(CONTROL_BINARY, path=path) is None
        simulated = settings.runtime.nvml.startswith("sim:") and missing
        root = mps_root(settings.config.flags.mps_root)
        return DraMps(root, cast(ComputeModes, nvml), environ, simulated=simulated)

    def resource(self, name: str) -> str:
        """A daemon's resource under the MPS root (`nvdp.node.mps.layout`)."""
        return f"{DRIVER_NAME}/{name}"

    def ensure_daemon(self, gpus: Sequence[str], holder: str) -> MpsDaemon:
        """The daemon of `gpus` (UUIDs, in the order clients number them), ready, with `holder` (a
        claim UID) among its holders. Raises MpsError."""
        if not gpus:
            raise MpsError("MPS: no GPU to serve")
        name = daemon_name(gpus)
        with self._lock:
            if self._stopped:
                raise MpsError("MPS: the plugin is stopping")
            for other in self._running.values():
                shared = sorted(set(other.daemon.gpus) & set(gpus))
                if other.daemon.name != name and shared:
                    raise MpsError(f"GPU {shared[0]} is under another MPS daemon ({other.daemon.name})")
            running = self._running.get(name) or self._new(name, tuple(gpus))
            self._running[name] = running
            added = holder not in running.holders
            running.holders.add(holder)
            marker = self.root.marker(self.resource(name))
            try:
                if added:
                    self._save(running)
                if self._simulated:
                    self._mark_simulated(running)
                    return running.daemon
                if marker.exists() and running.thread is not None and running.thread.is_alive():
                    return running.daemon  # up and healthy, as the controller's last query said
                if running.thread is None or not running.thread.is_alive():
                    self._start(running)
            except MpsError:
                self._drop(running, holder if added else None)
                raise
        try:
            self._wait(running, marker)
        except MpsError:
            with self._lock:
                self._drop(running, holder if added else None)
            raise
        return running.daemon

    def release(self, holder: str) -> None:
        """`holder` no longer uses its daemons; one left without holders stops (its GPUs back to
        DEFAULT), unless who uses it is unknown. Failures are logged: the claim is gone either way."""
        with self._lock:
            for running in [r for r in self._running.values() if holder in r.holders]:
                self._drop(running, holder)

    def resume(self, prepared: Collection[str]) -> None:
        """At the plugin's start: every daemon an earlier run left holders for is started again (its
        claims' containers are running); one that fails to start is retried by its controller. A
        holder that is not a `prepared` claim (the checkpoint's, or its rebuild's) is dropped first,
        with one WARNING: no daemon, and no GPU made exclusive, for a claim gone from the node."""
        with self._lock:
            for running in [r for r in self._running.values() if r.thread is None]:
                gone = sorted(running.holders - set(prepared))
                if gone:
                    log_event(
                        log,
                        logging.WARNING,
                        "MPS holders record names claims not prepared here; dropped",
                        daemon=running.daemon.name,
                        claims=",".join(gone),
                    )
                    running.holders.difference_update(gone)
                    self._drop(running, None)  # written; stopped when none is left
                if not running.holders:
                    continue
                if self._simulated:
                    self._mark_simulated(running)
                else:
                    self._start(running)

    def stop(self) -> None:
        """At the plugin's stop: every daemon quits, its GPUs back to DEFAULT; the records stay, for
        `resume` at the next start. No daemon starts after it."""
        with self._lock:
            self._stopped = True
            for running in self._running.values():
                self._stop(running)

    def holders(self) -> dict[str, frozenset[str]]:
        """Daemon name -> the claims holding it."""
        with self._lock:
            return {name: frozenset(r.holders) for name, r in self._running.items() if r.holders}

    # ---- the steps (under the lock, but `_wait`) ------------------------------------------------

    def _new(self, name: str, gpus: tuple[str, ...]) -> _Running:
        resource = self.resource(name)
        daemon = MpsDaemon(name, gpus, self.root.pipe_dir(resource), self.root.shm_dir)
        record = self.root.resource_dir(resource) / HOLDERS_FILE
        unknown = name in self._untrusted or (not record.exists() and daemon.pipe_dir.is_dir())
        if unknown and name not in self._untrusted:
            log_event(log, logging.WARNING, "MPS daemon directory without holders record; kept", daemon=name)
        return _Running(daemon, set(), kept=unknown)

    def _start(self, running: _Running) -> None:
        daemon = running.daemon
        resource = self.resource(daemon.name)
        plan = {resource: DaemonPlan(resource, tuple(GpuShare(u, 0, 0, 1) for u in daemon.gpus))}
        remove_status(self.root.status(resource))  # what an earlier run said is not news
        self.root.marker(resource).unlink(missing_ok=True)
        controller = _Keeping(
            self._nvml,
            self.root,
            lambda: plan,
            {**self._environ, VISIBLE_ENV: ",".join(daemon.gpus)},
            health_interval=self._health_interval,
            binary=self._binary,
        )
        thread = threading.Thread(target=controller.run, args=(plan,), name=f"mps-{daemon.name}", daemon=True)
        running.controller, running.thread = controller, thread
        log_event(log, logging.INFO, "starting MPS daemon", daemon=daemon.name, gpus=",".join(daemon.gpus))
        thread.start()

    def _wait(self, running: _Running, marker: Path) -> None:
        resource = self.resource(running.daemon.name)
        deadline, since = time.monotonic() + self._ready_timeout, time.time_ns() - STATUS_SLACK_NS
        while not marker.exists():
            why = _fresh_status(self.root.status(resource), since)
            thread = running.thread
            if why is None and (thread is None or not thread.is_alive()):
                why = "stopped"
            if why or time.monotonic() >= deadline:
                reason = why or f"not ready within {self._ready_timeout:g}s"
                raise MpsError(f"MPS daemon {running.daemon.name} is not ready: {reason}")
            time.sleep(READY_POLL_S)

    def _drop(self, running: _Running, holder: str | None) -> None:
        """`holder` (None: none) no longer holds `running`; without holders it stops (kept: stays)."""
        if holder is not None:
            running.holders.discard(holder)
        try:
            self._save(running)
        except MpsError as error:
            log_event(log, logging.WARNING, "cannot write MPS holders", error=str(error))
        if running.holders or running.kept or self._running.get(running.daemon.name) is not running:
            return
        del self._running[running.daemon.name]
        self._stop(running)
        log_event(log, logging.INFO, "MPS daemon stopped", daemon=running.daemon.name)

    def _stop(self, running: _Running) -> None:
        controller, thread = running.controller, running.thread
        running.controller = running.thread = None
        if self._simulated:
            self.root.marker(self.resource(running.daemon.name)).unlink(missing_ok=True)
        if controller is None or thread is None:
            return
        controller.request_stop()
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            controller.abandon()

    def _mark_simulated(self, running: _Running) -> None:
        resource = self.resource(running.daemon.name)
        marker = self.root.marker(resource)
        if marker.exists():
            return
        try:
            make_dirs(self.root.pipe_dir(resource))
            make_dirs(self.root.shm_dir)
            marker.touch()
        except OSError as error:
            raise MpsError(f"MPS: cannot create {marker.parent}: {error.strerror}") from error
        log_event(
            log,
            logging.INFO,
            "simulated node: no MPS control daemon started; its ready marker written",
            daemon=running.daemon.name,
            marker=str(marker),
        )

    def _save(self, running: _Running) -> None:
        path = self.root.resource_dir(self.resource(running.daemon.name)) / HOLDERS_FILE
        try:
            make_dirs(path.parent)
            write_record(path, running.daemon.gpus, running.holders, running.kept)
        except OSError as error:
            raise MpsError(f"MPS: cannot write {path}: {error.strerror}") from error

    def _load(self) -> None:
        """The daemons an earlier run of the plugin left, with their holders (see the rules)."""
        base = self.root.resource_dir(DRIVER_NAME)
        for path in sorted(base.glob(f"*/{HOLDERS_FILE}")):
            name = path.parent.name
            try:
                gpus, holders, kept = read_record(path, name)
            except (NvdpError, ValueError, KeyError, TypeError) as error:
                log_event(
                    log,
                    logging.WARNING,
                    "MPS holders record not trusted; its daemon kept",
                    path=str(path),
                    error=str(error),
                )
                self._untrusted.add(name)
                continue
            running = self._new(name, gpus)
            running.holders, running.kept = holders, running.kept or kept
            if holders or running.kept:
                self._running[name] = running


def _fresh_status(path: Path, since: int) -> str | None:
    """The reason a status file gives, if written at `since` (time_ns) or later: one written before is
    of a restart under way (the controller retries; the wait goes on)."""
    try:
        if path.stat().st_mtime_ns < since:
            return None
    except OSError:
        return None
    return read_status(path)
