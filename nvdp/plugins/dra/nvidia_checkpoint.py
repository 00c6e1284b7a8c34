"""NVIDIA's DRA driver's checkpoint, adopted, so a node moved from its gpu-kubelet-plugin keeps the
claims it prepared; both keep `<kubelet plugins dir>/gpu.nvidia.com/checkpoint.json`.

- Form: `{"checksum", "v1": {"preparedClaims"}, "v2": {"checksum", "preparedClaims", "nodeBootID"}}`
  (25.3: `v1` only, then completed claims only); a claim has `status` and `preparedDevices` (gpu /
  mig / vfio entries with NodePrepareResources' answer); V2 adds `checkpointState`, `name`, `namespace`.
- Checksums: FNV-32a of the compact JSON with the checksum 0 (`v1`: without `v2`), as Go's spew
  prints bytes; a mismatch is one WARNING and the claims are adopted anyway (the safe side).
- Completed claims go into nvdp's checkpoint (unprepare finds them, re-prepare answers the same,
  the hand-over keeps their GPUs); NVIDIA's file is kept as `checkpoint.json.nvidia`.
- Not adopted: claims only started (the kubelet prepares them again), and all claims from before
  the node's last boot.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.base.logs import log_event
from nvdp.plugins.dra.checkpoint import MAX_CHECKPOINT_BYTES, Checkpoint, PreparedClaim, PreparedDevice

log = logging.getLogger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
KEPT_SUFFIX = ".nvidia"
COMPLETED = "PrepareCompleted"
_DEVICE_KINDS = ("gpu", "mig", "vfio")
_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193


@dataclass(frozen=True)
class NvidiaCheckpoint:
    """What an NVIDIA checkpoint says: its completed claims, the UIDs of claims only started, the boot it
    was written in ("" for releases that do not say), and which checksums do not match."""

    claims: Mapping[str, PreparedClaim]
    started: tuple[str, ...]
    boot_id: str
    bad_checksums: tuple[str, ...]


def is_nvidia_checkpoint(data: object) -> bool:
    return isinstance(data, dict) and "checksum" in data and ("v1" in data or "v2" in data)


def parse(text: str) -> NvidiaCheckpoint:
    """Raises ValueError, KeyError or TypeError for a file not in NVIDIA's form."""
    data = loads_json(text, max_bytes=MAX_CHECKPOINT_BYTES)
    if not is_nvidia_checkpoint(data):
        raise ValueError("not an NVIDIA DRA driver checkpoint")
    v2 = data.get("v2")
    if v2 is not None:
        entries = dict(v2.get("preparedClaims") or {})
        boot_id = str(v2.get("nodeBootID") or "")
    else:
        entries = {
            uid: {**entry, "checkpointState": COMPLETED}
            for uid, entry in dict((data.get("v1") or {}).get("preparedClaims") or {}).items()
        }
        boot_id = ""
    claims = {
        uid: _claim(uid, entry) for uid, entry in entries.items() if entry.get("checkpointState") == COMPLETED
    }
    started = tuple(sorted(set(entries) - set(claims)))
    return NvidiaCheckpoint(claims, started, boot_id, bad_checksums(text))


def bad_checksums(text: str) -> tuple[str, ...]:
    """The checksums ("v1", "v2") that do not match the content, as NVIDIA's driver verifies them.
    A file not in Go's compact layout cannot be checked: both are said not to match."""
    found = re.match(r'\{"checksum":([0-9]+)', text)
    decoder = json.JSONDecoder()  # on text parse() read bounded: its nesting is safe
    try:
        if found is None:
            raise ValueError("not compact")
        position, parts = found.end(), {}
        for key in ("v1", "v2"):
            if text.startswith(f',"{key}":', position):
                start = position + len(key) + 4
                _, position = decoder.raw_decode(text, start)
                parts[key] = text[start:position]
        if text[position:] not in ("}", "}\n"):
            raise ValueError("not compact")
    except ValueError:
        return ("v1", "v2")
    bad = []
    v1 = f',"v1":{parts["v1"]}' if "v1" in parts else ""
    if go_checksum(f'{{"checksum":0{v1}}}'.encode()) != int(found[1]):
        bad.append("v1")
    if "v2" in parts:
        inner = re.match(r'\{"checksum":([0-9]+)', parts["v2"])
        zeroed = '{"checksum":0' + parts["v2"][inner.end() :] if inner else ""
        if inner is None or go_checksum(zeroed.encode()) != int(inner[1]):
            bad.append("v2")
    return tuple(bad)


def go_checksum(compact: bytes) -> int:
    """The kubelet checkpoint manager's checksum of JSON bytes: FNV-32a over spew's `%#v` of the slice,
    `([]uint8)[123 34 ...]`."""
    value = _FNV_OFFSET
    for byte in ("([]uint8)[" + " ".join(map(str, compact)) + "]").encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value


def adopt(checkpoint: Checkpoint, boot_id: str) -> None:
    """When `checkpoint.path` holds NVIDIA's checkpoint: its claims written in nvdp's form (the claims
    of another boot left out), NVIDIA's file kept beside as `<name>.nvidia`. A file in any other form
    is left to `Checkpoint.load`. Where nvdp's checkpoint cannot be written that is one WARNING."""
    path = checkpoint.path
    try:
        raw = read_bounded(path, MAX_CHECKPOINT_BYTES)
        text = raw.decode()
        found = parse(text)
    except (UnreadableFile, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return  # absent, or not NVIDIA's: nvdp's reader says what it is
    kept = path.with_name(path.name + KEPT_SUFFIX)
    if found.bad_checksums:
        log_event(
            log,
            logging.WARNING,
            "NVIDIA DRA driver checkpoint: checksum does not match; adopting its claims anyway",
            path=str(path),
            checksums=",".join(found.bad_checksums),
        )
    claims = dict(found.claims)
    if found.boot_id and boot_id and found.boot_id != boot_id:
        log_event(
            log,
            logging.INFO,
            "NVIDIA DRA driver checkpoint is from before the node's last boot; its claims are not adopted",
            path=str(path),
            claims=len(claims),
        )
        claims = {}
    try:
        write_atomic(kept, raw, 0o600)
        checkpoint.save(claims)
    except OSError as error:
        log_event(log, logging.WARNING, "cannot adopt NVIDIA's DRA driver checkpoint", error=str(error))
        return
    log_event(
        log,
        logging.INFO,
        "adopted the claims NVIDIA's DRA driver prepared",
        path=str(path),
        claims=",".join(sorted(claims)) or "none",
        not_completed=",".join(found.started) or "none",
        kept_as=str(kept),
    )


def current_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """The kernel's boot ID ("" where it cannot be read: then every claim is adopted)."""
    try:
        return read_bounded(path).decode("ascii", "replace").strip()
    except UnreadableFile:
        return ""


def _claim(uid: str, entry: Mapping[str, Any]) -> PreparedClaim:
    devices = []
    for group in entry.get("preparedDevices") or []:
        for device in group.get("devices") or []:
            for kind in _DEVICE_KINDS:
                prepared = (device.get(kind) or {}).get("device")
                if prepared:
                    devices.append(
                        PreparedDevice(
                            tuple(map(str, prepared.get("Requests") or ())),
                            str(prepared["PoolName"]),
                            str(prepared["DeviceName"]),
                            tuple(map(str, prepared.get("CDIDeviceIDs") or ())),
                        )
                    )
    # Releases 25.3 do not name the claim: its UID stands in (log lines, the hand-over's holder).
    namespace, name = str(entry.get("namespace") or ""), str(entry.get("name") or uid)
    return PreparedClaim(uid, namespace, name, tuple(devices))
