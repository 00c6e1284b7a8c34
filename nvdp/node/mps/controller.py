"""The MPS control daemon's main loop: one `nvidia-cuda-mps-control` daemon per MPS resource.

- Start per resource: its GPUs to EXCLUSIVE_PROCESS, pipe and log directories, the daemon, the
  default limits, then the ready marker the plugin waits for.
- Every `health_interval` a cheap query goes through the pipe; a daemon failing it (or to start)
  loses its marker and restarts after capped exponential backoff, its status file saying why
  (`nvdp.node.mps.status`). The daemon's log files are followed into this process's log.
- `request_reload()` converges on new plans by diff (start, stop or re-limit).
- `request_stop()` ends within seconds: an in-flight command is killed, the markers go, compute
  modes return to DEFAULT, every daemon gets `quit` (bounded by `nvdp.base.timers`' mpsQuitTimeout).
- Both requests come from another thread (nvdp.base.signals' dispatcher) and never block.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nvdp.base.backoff import delay_after
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import MpsError, NvdpError
from nvdp.base.logs import log_event
from nvdp.base.timers import TIMERS
from nvdp.node.nvml.types import ComputeMode, ComputeModes

from .control import MpsControl
from .layout import CONTROL_BINARY, MpsRoot
from .plan import DaemonPlan
from .status import remove_status, write_status

log = logging.getLogger(__name__)

HEALTH_QUERY = "get_default_active_thread_percentage"
LOG_FILES = ("control.log", "server.log")
LOG_READ_MAX = 1 << 20  # bytes of a daemon log file followed per pass
LOG_POLL_S = 1.0
STOP_QUIT_TIMEOUT_S = TIMERS.mps_quit_timeout  # [3 s] a daemon's `quit` at stop; a hung one is killed then


class PlanSource(Protocol):
    def __call__(self) -> Mapping[str, DaemonPlan]:
        """The daemons the node needs now; raises NvdpError when the config cannot be applied."""
        ...


@dataclass
class _Daemon:
    plan: DaemonPlan
    control: MpsControl
    up: bool = False
    failures: int = 0
    next_attempt: float = 0.0  # monotonic time of the next start attempt while down
    next_check: float = 0.0  # monotonic time of the next health query while up
    log_offsets: dict[Path, int] = field(default_factory=dict)


class MpsController:
    def __init__(
        self,
        nvml: ComputeModes,
        root: MpsRoot,
        load_plans: PlanSource,
        environ: Mapping[str, str],
        *,
        health_interval: float = 5.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
        binary: str = CONTROL_BINARY,
        clock: Callable[[], float] = time.monotonic,
        idle_reason: str | None = None,
    ) -> None:
        """`idle_reason`: why the daemons could not be planned at start (fail-on-init-error=false);
        `run` logs it and idles until a reload."""
        self._nvml = nvml
        self._idle_reason = idle_reason
        self.root = root
        self._load_plans = load_plans
        self._environ = environ
        self._health_interval = health_interval
        self._backoff_base, self._backoff_cap = backoff_base, backoff_cap
        self._binary = binary
        self._clock = clock
        self.daemons: dict[str, _Daemon] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()  # also cancels the control command in flight
        self._reload = False

    # ---- requests (nvdp.base.signals' dispatcher, other threads) ------------------------------------
    def request_stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def request_reload(self) -> bool:
        """Ask for a reload; True when that made one pending (False: one already was)."""
        newly = not self._reload
        self._reload = True
        self._wake.set()
        return newly

    def abandon(self) -> None:
        """The stop did not finish (NVML or a child blocks the loop): kill the running control
        commands, remove the ready markers and restore the compute modes now. Any thread."""
        daemons = list(self.daemons.values())
        for daemon in daemons:
            daemon.control.kill_running()
        for daemon in daemons:
            self._remove_marker(daemon.plan.resource)
        self._restore_compute_modes(daemons)

    # ---- main loop ----------------------------------------------------------------------------
    def run(self, plans: Mapping[str, DaemonPlan]) -> None:
        """Serve `plans` until request_stop(), then tear every daemon down."""
        make_dirs(self.root.shm_dir)  # the root too
        try:
            self._converge(plans)
            if self._idle_reason is not None:
                log_event(
                    log,
                    logging.ERROR,
                    "cannot start MPS daemons; idling until SIGHUP (fail-on-init-error=false)",
                    error=self._idle_reason,
                )
            elif not plans:
                log_event(log, logging.INFO, "no MPS daemons to run on this node; waiting (SIGHUP reloads)")
            while not self._stopping.is_set():
                if self._reload:
                    self._reload = False
                    self._do_reload()
                self._tick()
                self._wake.wait(self._next_wake())
                self._wake.clear()
        finally:
            self._stop_all()
            log_event(log, logging.INFO, "MPS control daemon stopped")

    def _do_reload(self) -> None:
        log_event(log, logging.INFO, "reloading configuration")
        try:
            plans = self._load_plans()
        except NvdpError as error:
            log_event(log, logging.ERROR, "reload failed; keeping the running daemons", error=str(error))
            return
        self._converge(plans)
        log_event(log, logging.INFO, "reloaded", resources=",".join(sorted(self.daemons)) or "none")

    def _converge(self, plans: Mapping[str, DaemonPlan]) -> None:
        for name in list(self.daemons):
            old = self.daemons[name].plan
            new = plans.get(name)
            if new is None:
                self._teardown(name, "removed")
            elif new.uuids != old.uuids:
                self._teardown(name, "devices changed")
        for name, plan in plans.items():
            daemon = self.daemons.get(name)
            if daemon is None:
                self.daemons[name] = daemon = self._new_daemon(plan)
                self._start(daemon)
            elif daemon.plan != plan:
                daemon.plan = plan
                if daemon.up:
                    self._relimit(daemon)

    def _new_daemon(self, plan: DaemonPlan) -> _Daemon:
        name = plan.resource
        control = MpsControl(
            self.root.pipe_dir(name),
            self.root.log_dir(name),
            self._environ,
            binary=self._binary,
            cancel=self._stopping,
        )
        daemon = _Daemon(plan, control)
        remove_status(self.root.status(name))  # what an earlier run said is not news
        for file in LOG_FILES:  # follow from now on, not what earlier runs wrote
            path = control.log_dir / file
            daemon.log_offsets[path] = path.stat().st_size if path.exists() else 0
        return daemon

    def _tick(self) -> None:
        now = self._clock()
        for daemon in self.daemons.values():
            if daemon.up and now >= daemon.next_check:
                self._check(daemon)
            elif not daemon.up and now >= daemon.next_attempt:
                self._start(daemon)
            self._follow_logs(daemon)

    def _next_wake(self) -> float:
        now = self._clock()
        due = [d.next_check if d.up else d.next_attempt for d in self.daemons.values()]
        wait = min([LOG_POLL_S, *(t - now for t in due)]) if self.daemons else None
        return max(0.0, wait) if wait is not None else 3600.0

    # ---- one daemon ---------------------------------------------------------------------------
    def _start(self, daemon: _Daemon) -> None:
        plan = daemon.plan
        name = plan.resource
        log_event(log, logging.INFO, "starting MPS daemon", resource=name, gpus=",".join(plan.uuids))
        path = os.pathsep.join(os.get_exec_path(dict(self._environ)))
        if shutil.which(self._binary, path=path) is None:  # before the GPUs are made exclusive
            missing = MpsError(f"{self._binary}: not found on PATH")
            self._down(daemon, "MPS daemon failed to start", missing, status=f"{self._binary} not found")
            return
        try:
            self._set_compute_mode(plan.uuids, ComputeMode.EXCLUSIVE_PROCESS)
            make_dirs(daemon.control.pipe_dir)
            make_dirs(daemon.control.log_dir)
            self._start_daemon(daemon)
            for command in plan.limit_commands():
                daemon.control.send(command)
            self.root.marker(name).touch()
        except (NvdpError, OSError) as error:
            self._down(daemon, "MPS daemon failed to start", error)
            return
        remove_status(self.root.status(name))
        daemon.up = True
        daemon.next_check = self._clock() + self._health_interval
        log_event(
            log,
            logging.INFO,
            "MPS daemon ready",
            resource=name,
            marker=str(self.root.marker(name)),
            limits=";".join(plan.limit_commands()),
        )

    def _start_daemon(self, daemon: _Daemon) -> None:
        """`-d`; when that fails because a daemon from an earlier run of this command still answers
        on the pipe (this container restarted, the daemon did not), quit that one and start ours."""
        try:
            daemon.control.start_daemon()
        except MpsError as error:
            try:
                daemon.control.send(HEALTH_QUERY)
            except MpsError:
                raise error from None
            self._earlier_daemon_answers(daemon)

    def _earlier_daemon_answers(self, daemon: _Daemon) -> None:
        """A daemon of an earlier run answers on the pipe: quit it and start ours."""
        message = "an MPS daemon from an earlier run answers on the pipe; replacing it"
        log_event(log, logging.WARNING, message, resource=daemon.plan.resource)
        daemon.control.send("quit")
        daemon.control.start_daemon()

    def _check(self, daemon: _Daemon) -> None:
        try:
            daemon.control.send(HEALTH_QUERY)
        except NvdpError as error:
            self._down(daemon, "MPS daemon unhealthy; restarting", error)
            return
        daemon.failures = 0
        daemon.next_check = self._clock() + self._health_interval
        self._keep_exclusive(daemon)

    def _keep_exclusive(self, daemon: _Daemon) -> None:
        """Set EXCLUSIVE_PROCESS again on a GPU whose compute mode changed behind the daemon (a
        driver reload resets it to DEFAULT; `nvidia-smi -c`): otherwise processes outside MPS could
        use the GPU beside its clients, past every limit."""
        for uuid in daemon.plan.uuids:
            try:
                mode = self._nvml.compute_mode(uuid)
                if mode == ComputeMode.EXCLUSIVE_PROCESS:
                    continue
                log_event(
                    log,
                    logging.WARNING,
                    "compute mode changed behind the MPS daemon; restoring EXCLUSIVE_PROCESS",
                    resource=daemon.plan.resource,
                    gpu=uuid,
                    mode=mode.name,
                )
                self._set_compute_mode((uuid,), ComputeMode.EXCLUSIVE_PROCESS)
            except NvdpError as error:
                log_event(log, logging.WARNING, "cannot check compute mode", gpu=uuid, error=str(error))

    def _relimit(self, daemon: _Daemon) -> None:
        try:
            for command in daemon.plan.limit_commands():
                daemon.control.send(command)
        except NvdpError as error:
            self._down(daemon, "MPS daemon refused new limits; restarting", error)
            return
        log_event(
            log,
            logging.INFO,
            "MPS daemon limits updated",
            resource=daemon.plan.resource,
            limits=";".join(daemon.plan.limit_commands()),
        )

    def _down(self, daemon: _Daemon, what: str, error: Exception, status: str | None = None) -> None:
        """Mark a daemon down: marker gone (the plugin withdraws the resource), the reason in its
        status file (`status`, else what failed and why), retry later. Nothing while stopping (the
        command failed because it was cancelled; the stop tears down)."""
        if self._stopping.is_set():
            return
        self._remove_marker(daemon.plan.resource)
        self._say_status(daemon.plan.resource, status or f"{what.partition(';')[0]}: {error}")
        daemon.up = False
        daemon.failures += 1
        delay = delay_after(daemon.failures, self._backoff_base, self._backoff_cap)
        daemon.next_attempt = self._clock() + delay
        log_event(
            log,
            logging.ERROR,
            what,
            resource=daemon.plan.resource,
            error=str(error),
            failures=daemon.failures,
            retry_in=round(delay, 3),
        )

    def _teardown(self, name: str, reason: str) -> None:
        """One daemon that a reload removes. When a stop cancels its `quit`, the daemon stays listed
        for `_stop_all` to quit."""
        daemon = self.daemons[name]
        self._remove_marker(name)
        self._quit(daemon, reason)
        if self._stopping.is_set():
            return
        still_used = {u for n, d in self.daemons.items() if n != name for u in d.plan.uuids}
        try:
            self._set_compute_mode(
                tuple(u for u in daemon.plan.uuids if u not in still_used), ComputeMode.DEFAULT
            )
        except NvdpError as error:
            log_event(log, logging.WARNING, "cannot restore compute mode", resource=name, error=str(error))
        self._follow_logs(daemon)
        del self.daemons[name]

    def _stop_all(self) -> None:
        """Every daemon down within a few seconds, hung ones included: the markers first (the
        plugin withdraws the resources), then the GPUs' compute modes back to DEFAULT (before
        anything that may hang), then `quit` to every daemon at once, each bounded."""
        daemons = list(self.daemons.values())
        for daemon in daemons:
            self._remove_marker(daemon.plan.resource)
        self._restore_compute_modes(daemons)
        quits = [
            threading.Thread(
                target=self._quit,
                args=(daemon, "stopping", STOP_QUIT_TIMEOUT_S),
                name=f"mps-quit-{daemon.plan.resource}",
            )
            for daemon in daemons
        ]
        for thread in quits:
            thread.start()
        for thread in quits:
            thread.join()  # bounded: each quit is killed after STOP_QUIT_TIMEOUT_S
        for daemon in daemons:
            self._follow_logs(daemon)
        self.daemons.clear()

    def _quit(self, daemon: _Daemon, reason: str, timeout: float | None = None) -> None:
        """`quit`; a stop's own quit (`timeout` given) is not cancelled by the stop."""
        name = daemon.plan.resource
        try:
            answer = daemon.control.send("quit", timeout=timeout, cancellable=timeout is None)
            log_event(log, logging.INFO, "MPS daemon quit", resource=name, reason=reason, output=answer)
        except NvdpError as error:
            log_event(log, logging.WARNING, "MPS daemon quit failed", resource=name, error=str(error))

    def _restore_compute_modes(self, daemons: list[_Daemon]) -> None:
        """DEFAULT on every GPU of `daemons`, each GPU once; a failure is logged and the rest go on."""
        for uuid in dict.fromkeys(uuid for daemon in daemons for uuid in daemon.plan.uuids):
            try:
                self._set_compute_mode((uuid,), ComputeMode.DEFAULT)
            except NvdpError as error:
                log_event(log, logging.WARNING, "cannot restore compute mode", gpu=uuid, error=str(error))

    def _set_compute_mode(self, uuids: tuple[str, ...], mode: ComputeMode) -> None:
        for uuid in uuids:
            self._nvml.set_compute_mode(uuid, mode)
            log_event(log, logging.INFO, "compute mode set", gpu=uuid, mode=mode.name)

    def _say_status(self, name: str, reason: str) -> None:
        try:
            make_dirs(self.root.resource_dir(name))
            write_status(self.root.status(name), reason)
        except OSError as error:
            log_event(log, logging.WARNING, "cannot write MPS status file", resource=name, error=str(error))

    def _remove_marker(self, name: str) -> None:
        """Remove the ready marker, and the status file with it (nothing to say once stopped)."""
        remove_status(self.root.status(name))
        try:
            self.root.marker(name).unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            log_event(log, logging.WARNING, "cannot remove ready marker", resource=name, error=str(error))

    def _follow_logs(self, daemon: _Daemon) -> None:
        for path, offset in daemon.log_offsets.items():
            try:
                with path.open("rb") as f:
                    size = f.seek(0, 2)
                    if size < offset:  # truncated or replaced: start over
                        offset = 0
                    f.seek(offset)
                    data = f.read(LOG_READ_MAX)  # the rest on the next pass
            except OSError:  # not there (yet), or unreadable: the next pass looks again
                continue
            complete = data.rfind(b"\n") + 1
            for line in data[:complete].decode(errors="replace").splitlines():
                if line.strip():
                    log_event(
                        log, logging.INFO, "mps log", resource=daemon.plan.resource, file=path.name, line=line
                    )
            daemon.log_offsets[path] = offset + complete
