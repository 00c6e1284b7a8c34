"""Find the process to signal by name in /proc (shareProcessNamespace in the pod) and signal it.

- A process goes by argv[0], its executable, and, for an interpreter running a script (a console
  script runs as `python3 /usr/local/bin/nvidia-device-plugin`), the script.
- `nvdp SUBCOMMAND` also goes by its console script (`nvdp plugin` is `nvidia-device-plugin`).
- A name without `/` matches a program of that base name.
- A name with `/` matches argv[0] exactly (NVIDIA's rule) or a program path that is the same file
  after symlinks: `--process-to-signal /usr/bin/mps-control-daemon` (NVIDIA's chart) also finds
  `nvdp mps-control-daemon`, as the image links /usr/bin to the console scripts.
- Links are resolved in this container; the pod's containers run the same image.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_INTERPRETERS = ("python", "sh", "bash", "dash")
# `nvdp SUBCOMMAND` -> the console script that runs it (nvdp.cli, pyproject's [project.scripts]).
NVDP_SUBCOMMANDS = {
    "plugin": "nvidia-device-plugin",
    "gfd": "gpu-feature-discovery",
    "config-manager": "config-manager",
    "mps-control-daemon": "mps-control-daemon",
    "dra-kubelet-plugin": "gpu-kubelet-plugin",
}


def program_names(argv: list[str], exe: str | None) -> list[str]:
    """The paths (or bare names, as argv[0] may be) that a process's program goes by."""
    names = argv[:1] + ([exe] if exe is not None else [])
    if not argv:
        return names
    program = 0  # argv[program] is the program, whose arguments follow it
    if len(argv) > 1 and any(os.path.basename(n).startswith(_INTERPRETERS) for n in names):
        names.append(argv[1])
        program = 1
    arguments = argv[program + 1 :]
    if os.path.basename(argv[program]) == "nvdp" and arguments and arguments[0] in NVDP_SUBCOMMANDS:
        names.append(os.path.join(os.path.dirname(argv[program]), NVDP_SUBCOMMANDS[arguments[0]]))
    return names


def matches(name: str, argv: list[str], exe: str | None) -> bool:
    names = program_names(argv, exe)
    if "/" not in name:
        return any(os.path.basename(n) == name for n in names)
    if name in names:
        return True
    target = os.path.realpath(name)
    return any(os.path.isabs(n) and os.path.realpath(n) == target for n in names)


def find(name: str, proc: Path = PROC) -> list[int]:
    """The pids (other than this one) whose process matches `name`, ascending."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue  # gone, or not ours to read
        try:
            exe: str | None = os.readlink(entry / "exe")
        except OSError:
            exe = None
        if matches(name, argv, exe):
            found.append(int(entry.name))
    return sorted(found)


def signal_by_name(name: str, signum: int, proc: Path = PROC) -> list[int]:
    """Send `signum` to every process matching `name`; the pids signalled (empty: none found)."""
    sent = []
    for pid in find(name, proc):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        sent.append(pid)
    return sent
