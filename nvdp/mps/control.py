"""`nvidia-cuda-mps-control` for one resource: start the daemon, send it one command.

Every command is its own invocation with the command on stdin (as NVIDIA's control daemon does),
with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY naming this resource's daemon.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from nvdp.errors import MpsError as MpsError  # defined in nvdp.errors

from .layout import CONTROL_BINARY, LOG_ENV, PIPE_ENV

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 10.0


class MpsControl:
    def __init__(
        self,
        pipe_dir: Path,
        log_dir: Path,
        environ: Mapping[str, str],
        *,
        binary: str = CONTROL_BINARY,
        timeout: float = COMMAND_TIMEOUT_S,
    ) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary
        self.timeout = timeout
        self._env = {**environ, PIPE_ENV: str(pipe_dir), LOG_ENV: str(log_dir)}

    def start_daemon(self) -> None:
        """`nvidia-cuda-mps-control -d`: the control daemon forks into the background."""
        self._run(["-d"], None, "start the MPS control daemon")

    def send(self, command: str) -> str:
        """One command through the control pipe; returns what the daemon answered."""
        return self._run([], command, repr(command))

    def _run(self, args: list[str], stdin: str | None, what: str) -> str:
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
            try:
                process.communicate(stdin.encode() if stdin is not None else None, timeout=self.timeout)
            except subprocess.TimeoutExpired as error:
                process.kill()
                process.wait()
                raise MpsError(f"{self.binary}: {what} did not finish within {self.timeout:g}s") from error
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        if process.returncode != 0:
            detail = (stderr or stdout).strip().splitlines()
            reason = f": {detail[-1]}" if detail else ""
            raise MpsError(f"{self.binary}: {what} failed with exit status {process.returncode}{reason}")
        return stdout.strip()
