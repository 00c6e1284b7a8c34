"""Why an MPS resource is not ready, from the MPS control daemon to the plugin: `<root>/<resource>/.status`.

- The daemon (`nvdp.node.mps.controller`) writes one line (`nvidia-cuda-mps-control not found`)
  atomically when it cannot start or keep a resource's daemon, and removes it once ready or stopped.
- The plugin (`nvdp.node.mps.ready`) reads at most MAX_BYTES, first line, printable characters only:
  the reason in its warning, Node event and `/readyz`.
- The text stays the same while the cause does (no counts, no times), so each cause is reported once.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from nvdp.base.files import write_atomic

MAX_BYTES = 512
MAX_CHARS = 300


def write_status(path: Path, reason: str) -> None:
    """Say `reason` at `path` (created 0644, replacing what was there). Raises OSError."""
    line = _clean(reason).encode()[:MAX_BYTES] + b"\n"
    write_atomic(path, line)


def read_status(path: Path) -> str | None:
    """The reason at `path`; None when there is none (missing, empty, not a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _clean(data.decode("utf-8", "replace").partition("\n")[0]) or None


def remove_status(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _clean(text: str) -> str:
    text = "".join(c for c in text if c.isprintable()).strip()
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."
