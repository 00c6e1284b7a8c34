"""A DRA MPS daemon's name and its holders record (`nvdp.plugins.dra.mps`):
`<MPS root>/gpu.nvidia.com/<name>/holders.json`, `{"gpus": [...], "holders": [...], "kept": bool}`.

- Written atomically at every change of holders (also when the last goes: `[]`).
- Read bounded (RECORD_MAX_BYTES), never through a link, and trusted only when: its devices (1 to
  MAX_DEVICES) name its directory (`daemon_name`), at most MAX_HOLDERS holders, every entry a plain
  identifier (a GPU / MIG UUID, a claim UID). Anything else is a ValueError (NvdpError: unreadable).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from pathlib import Path

from nvdp.base.bounded import loads_json
from nvdp.base.files import read_bounded, write_atomic

HOLDERS_FILE = "holders.json"
RECORD_MAX_BYTES = 256 << 10
MAX_DEVICES = 64
MAX_HOLDERS = 1024
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # GPU / MIG UUIDs, claim UIDs


def daemon_name(gpus: Sequence[str]) -> str:
    """The GPU's UUID, or `gpus-<hash of the UUIDs>` for several."""
    if len(gpus) == 1:
        return gpus[0]
    return "gpus-" + hashlib.sha256(",".join(sorted(gpus)).encode()).hexdigest()[:12]


def write_record(path: Path, gpus: Sequence[str], holders: Collection[str], kept: bool) -> None:
    """Raises OSError."""
    record = {"gpus": list(gpus), "holders": sorted(holders), "kept": kept}
    write_atomic(path, (json.dumps(record) + "\n").encode())


def read_record(path: Path, name: str) -> tuple[tuple[str, ...], set[str], bool]:
    """A holders record's devices, holders and whether its daemon is kept, checked. Raises
    ValueError (or NvdpError: unreadable)."""
    if path.is_symlink():
        raise ValueError("a link")
    record = loads_json(read_bounded(path, RECORD_MAX_BYTES), max_bytes=RECORD_MAX_BYTES)
    gpus, holders = record["gpus"], record["holders"]
    if not isinstance(gpus, list) or not isinstance(holders, list):
        raise ValueError("gpus and holders must be lists")
    if not 0 < len(gpus) <= MAX_DEVICES or len(holders) > MAX_HOLDERS:
        raise ValueError(f"more than {MAX_DEVICES} devices or {MAX_HOLDERS} holders, or no device")
    if not all(isinstance(e, str) and _ID.fullmatch(e) for e in (*gpus, *holders)):
        raise ValueError("an entry is no UUID")
    if daemon_name(gpus) != name:
        raise ValueError(f"its devices are not those of {name}")
    return tuple(gpus), set(holders), record.get("kept") is True
