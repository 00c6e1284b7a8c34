"""Find the plugin process by name in /proc and signal it (shareProcessNamespace in the pod).

A process matches `name` when its executable's base name is `name`, when argv[0]'s base name is, or,
for an interpreter running a script (our console scripts run as `python .../nvidia-device-plugin`),
when the script's base name is. A name with a `/` must match the path exactly instead.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_INTERPRETERS = ("python", "sh", "bash", "dash")


def matches(name: str, argv: list[str], exe: str | None) -> bool:
    if not argv and exe is None:
        return False
    candidates = [argv[0]] if argv else []
    if exe is not None:
        candidates.append(exe)
    if len(argv) > 1 and any(os.path.basename(c).startswith(_INTERPRETERS) for c in candidates):
        candidates.append(argv[1])
    if "/" in name:
        return name in candidates
    return any(os.path.basename(c) == name for c in candidates)


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
