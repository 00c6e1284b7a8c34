"""What /proc says about a process: peak and current RSS, threads, fds, CPU time, wake-ups."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStats:
    """One reading of a process: memory (MiB), threads, fds, CPU seconds, context switches."""

    peak_rss_mib: float  # VmHWM
    rss_mib: float  # VmRSS
    threads: int
    fds: int
    cpu_s: float  # utime + stime
    switches: int  # voluntary + involuntary context switches of every thread (wake-ups)

    @classmethod
    def read(cls, pid: int) -> ProcStats:
        status = _status_fields(f"/proc/{pid}/status")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICK  # utime, stime (fields 14, 15)
        switches = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                t = _status_fields(f"/proc/{pid}/task/{task}/status")
            except FileNotFoundError:
                continue
            switches += int(t.get("voluntary_ctxt_switches", 0)) + int(t.get("nonvoluntary_ctxt_switches", 0))
        return cls(
            peak_rss_mib=_kib(status["VmHWM"]) / 1024,
            rss_mib=_kib(status["VmRSS"]) / 1024,
            threads=int(status["Threads"]),
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            cpu_s=cpu,
            switches=switches,
        )


def _status_fields(path: str) -> dict[str, str]:
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _kib(value: str) -> int:
    return int(value.split()[0])
