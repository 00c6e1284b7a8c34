"""A stand-in `nvidia-cuda-mps-control` for the tests and the benchmarks: a small script written into
a temp dir that goes first on PATH. It records every invocation (argv, the MPS env vars,
CUDA_VISIBLE_DEVICES, stdin) as a JSON line in `calls.jsonl`; `-d` "starts" a daemon (a `control`
file in the pipe dir and a line in
`<log>/control.log`); a command needs that file (else it fails like the real one with no daemon),
answers `get_*` with 100 and `quit` removes the file. Like a daemon that keeps its inherited
stdout / stderr, the forked "daemon" holds them until it quits. Knob files make it fail: `fail-start` /
`fail-command` hold how many of the next `-d` / commands fail, `hang-command` how many of the next
commands hang (for a minute, as a client of a wedged daemon waits on its pipe). `kill_daemon` makes the
daemon die; `-d` while one runs fails, as the real one does.

Beside it, `mps-client` stands in for a CUDA program in a container: run with a container's env
(`connect`), it reaches the daemon named by CUDA_MPS_PIPE_DIRECTORY (failing as a client does when
none runs there) and records the limits it got (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) in `clients.jsonl`, read back by `clients()`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCRIPT = """#!{python}
import fcntl, json, os, sys, time
state = os.environ["MPS_STANDIN_DIR"]
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
logdir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "")
args = sys.argv[1:]
stdin = "" if args else sys.stdin.read()
record = {{"argv": args, "pipe": pipe, "log": logdir, "stdin": stdin, "t": time.monotonic(),
          "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\\n")

def knob(name):
    try:
        f = open(os.path.join(state, name), "r+")
    except FileNotFoundError:
        return False
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # commands run at the same time (the quits of a stop)
        n = int(f.read() or 0)
        if n <= 0:
            return False
        f.seek(0)
        f.truncate()
        f.write(str(n - 1))
        return True

alive = os.path.join(pipe, "control")
if args != ["-d"] and knob("hang-command"):
    time.sleep(60)
    sys.exit(1)
if args == ["-d"]:
    if os.path.exists(alive):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    if knob("fail-start"):
        print("stand-in: told to fail -d", file=sys.stderr)
        sys.exit(1)
    open(alive, "w").close()
    with open(os.path.join(logdir, "control.log"), "a") as f:
        f.write("[stand-in] Starting control daemon\\n")
    if os.fork() == 0:  # the daemon, keeping the inherited stdout / stderr open until it quits
        deadline = time.monotonic() + 30
        while os.path.exists(alive) and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(0)
    sys.exit(0)
if not os.path.exists(alive):
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
if knob("fail-command"):
    sys.exit(1)
command = stdin.strip()
with open(os.path.join(logdir, "control.log"), "a") as f:
    f.write("[stand-in] command " + command + "\\n")
if command == "quit":
    os.unlink(alive)
elif command.startswith("get_"):
    print("100")
"""


CLIENT = """#!{python}
import json, os, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
if not pipe or not os.path.exists(os.path.join(pipe, "control")):
    print("stand-in client: no MPS control daemon at " + repr(pipe), file=sys.stderr)
    sys.exit(1)
record = {{
    "name": sys.argv[1],
    "pipe": pipe,
    "pinned": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    "threads": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
}}
with open(os.path.join(os.environ["MPS_STANDIN_DIR"], "clients.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


class Standin:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.bin = directory / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        script = self.bin / "nvidia-cuda-mps-control"
        script.write_text(SCRIPT.format(python=sys.executable))
        script.chmod(0o755)
        client = self.bin / "mps-client"
        client.write_text(CLIENT.format(python=sys.executable))
        client.chmod(0o755)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["MPS_STANDIN_DIR"] = str(self.dir)
        return env

    def on_path(self) -> dict[str, str]:
        """Just the env a process needs to find the stand-in first on PATH (for `clean_env`'s extra)."""
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "MPS_STANDIN_DIR": str(self.dir),
        }

    def calls(self) -> list[dict[str, Any]]:
        path = self.dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def commands(self, pipe: Path | None = None) -> list[str]:
        """`-d` and every stdin command in order (for one daemon's pipe dir, or all)."""
        return [
            "-d" if call["argv"] == ["-d"] else call["stdin"]
            for call in self.calls()
            if pipe is None or call["pipe"] == str(pipe)
        ]

    def connect(self, name: str, container_env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        """Run the stand-in client `name` with a container's env (as its CDI edits set it)."""
        env = {"MPS_STANDIN_DIR": str(self.dir), "PATH": os.environ.get("PATH", ""), **container_env}
        command = [str(self.bin / "mps-client"), name]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)

    def clients(self) -> dict[str, dict[str, Any]]:
        """The clients that reached a daemon, by name: the pipe and the limits each got."""
        path = self.dir / "clients.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return {record["name"]: record for record in map(json.loads, lines)}

    def fail_start(self, times: int) -> None:
        (self.dir / "fail-start").write_text(str(times))

    def fail_command(self, times: int) -> None:
        (self.dir / "fail-command").write_text(str(times))

    def hang_command(self, times: int) -> None:
        (self.dir / "hang-command").write_text(str(times))

    @staticmethod
    def kill_daemon(pipe: Path) -> None:
        (pipe / "control").unlink()

    @staticmethod
    def running(pipe: Path) -> bool:
        return (pipe / "control").exists()
