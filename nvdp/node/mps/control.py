"""`nvidia-cuda-mps-control` for one resource: start the daemon, send it one command.

Every command is its own invocation with the command on stdin (as NVIDIA's control daemon does),
with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY naming this resource's daemon. A command that
hangs is killed after its timeout, or as soon as the `cancel` event is set (the command is
stopping), so that a hung control daemon never holds a stop back.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from nvdp.base.errors import MpsError as MpsError  # defined in nvdp.base.errors

from .layout import CONTROL_BINARY, LOG_ENV, PIPE_ENV

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 10.0
CANCEL_POLL_S = 0.05  # how often a running command looks at `cancel`
KILL_WAIT_S = 1.0  # how long a killed command is waited for (then left to be reaped at exit)


class MpsControl:
    def __init__(
        self,
        pipe_dir: Path,
        log_dir: Path,
        environ: Mapping[str, str],
        *,
        binary: str = CONTROL_BINARY,
        timeout: float = COMMAND_TIMEOUT_S,
        cancel: threading.Event | None = None,
    ) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary
        self.timeout = timeout
        self._cancel = cancel
        self._env = {**environ, PIPE_ENV: str(pipe_dir), LOG_ENV: str(log_dir)}
        self._running: set[subprocess.Popen[bytes]] = set()

    def start_daemon(self) -> None:
        """`nvidia-cuda-mps-control -d`: the control daemon forks into the background."""
        self._run(["-d"], None, "start the MPS control daemon", self.timeout, self._cancel)

    def send(self, command: str, *, timeout: float | None = None, cancellable: bool = True) -> str:
        """One command through the control pipe; returns what the daemon answered. `timeout`
        replaces the usual one; `cancellable=False`: not ended by `cancel` (the `quit` of a stop)."""
        cancel = self._cancel if cancellable else None
        return self._run([], command, repr(command), self.timeout if timeout is None else timeout, cancel)

    def kill_running(self) -> None:
        """Kill every command still running, from any thread (a stop that did not finish)."""
        for process in list(self._running):
            try:
                process.kill()
            except OSError:
                pass

    def _run(
        self, args: list[str], stdin: str | None, what: str, timeout: float, cancel: threading.Event | None
    ) -> str:
        # Output goes to files, not pipes: `-d` forks a daemon that may keep the inherited
        # descriptors open, and reading a pipe to its end would then wait for the daemon to exit.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(
                    [self.binary, *args],
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=self._env,
                )
            except FileNotFoundError as error:
                raise MpsError(f"{self.binary}: not found on PATH (needed to {what})") from error
            except OSError as error:
                raise MpsError(f"{self.binary}: cannot run it to {what}: {error}") from error
            self._running.add(process)
            try:
                self._wait(process, stdin, what, timeout, cancel)
            finally:
                self._running.discard(process)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        if process.returncode != 0:
            detail = (stderr or stdout).strip().splitlines()
            reason = f": {detail[-1]}" if detail else ""
            raise MpsError(f"{self.binary}: {what} failed with exit status {process.returncode}{reason}")
        return stdout.strip()

    def _wait(
        self,
        process: subprocess.Popen[bytes],
        stdin: str | None,
        what: str,
        timeout: float,
        cancel: threading.Event | None,
    ) -> None:
        """Feed `stdin` and wait for the exit; kill the command after `timeout` or once `cancel` is
        set (raising MpsError)."""
        deadline = time.monotonic() + timeout
        data = stdin.encode() if stdin is not None else None
        while True:
            left = deadline - time.monotonic()
            try:
                process.communicate(data, timeout=max(0.0, min(left, CANCEL_POLL_S)))
                return
            except subprocess.TimeoutExpired:
                data = None  # sent by the first call; a second one must not send it again
            if cancel is not None and cancel.is_set():
                problem = "cancelled: stopping"
            elif left <= 0:
                problem = f"did not finish within {timeout:g}s"
            else:
                continue
            process.kill()
            try:
                process.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            raise MpsError(f"{self.binary}: {what} {problem}")
