"""The prepared claims on disk (`<kubelet plugins dir>/gpu.nvidia.com/checkpoint.json`), so that a
restarted plugin answers a repeated NodePrepareResources the same and can still unprepare.

- One JSON object `{"version": "nvdp/v1", "claims": {uid: {namespace, name, devices: [...]}}}`,
  written atomically once per change (a NodePrepareResources call's claims together).
- A save over MAX_CHECKPOINT_BYTES is refused, one line.
- A file unreadable or not ours (truncated, not JSON, too large, symlink, FIFO, directory) is one
  WARNING and set aside as `checkpoint.json.bad-<unix time>` (KEPT_BAD kept); `load` says None and
  `nvdp.plugins.dra.prepare` rebuilds the claims from their CDI specs and the API: nothing in use is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.base.logs import log_event
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.dra.names import CHECKPOINT_FILE

log = logging.getLogger(__name__)

FORMAT = "nvdp/v1"
MAX_CHECKPOINT_BYTES = 16 << 20
BAD_SUFFIX = ".bad-"
KEPT_BAD = 3


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answered it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class MadeMig:
    """A MIG device made for a claim (`dra.dynamicMig`): destroyed when the claim is unprepared."""

    gpu_uuid: str
    gi_id: int  # its GPU instance
    uuid: str  # MIG-...: destroyed only while this MIG device is still there
    device: str  # the allocated device it is


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    made: tuple[MadeMig, ...] = ()  # written only when there are any


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim] | None:
        """The prepared claims by UID; none when there is no file; None when it is unreadable (said
        once, the file set aside)."""
        if not os.path.lexists(self.path):
            return {}
        try:
            data = loads_json(read_bounded(self.path, MAX_CHECKPOINT_BYTES), max_bytes=MAX_CHECKPOINT_BYTES)
            if not isinstance(data, dict) or data.get("version") != FORMAT:
                raise ValueError(f"not an nvdp checkpoint (version {FORMAT})")
            return {uid: _claim(uid, entry) for uid, entry in dict(data["claims"]).items()}
        except (UnreadableFile, ValueError, KeyError, TypeError) as error:
            aside = self._set_aside()
            log_event(
                log,
                logging.WARNING,
                "checkpoint unreadable; rebuilding the prepared claims from their CDI specs and the API",
                path=str(self.path),
                error=str(error),
                kept_as=aside,
            )
            return None

    def _set_aside(self) -> str:
        """Rename the unreadable file to `<name>.bad-<unix time>`, keeping the last KEPT_BAD such
        files; what it was renamed to (or why it could not be)."""
        aside = self.path.with_name(f"{self.path.name}{BAD_SUFFIX}{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError as error:
            return f"not set aside: {error.strerror or error}"
        kept = sorted(
            (p for p in self.path.parent.glob(self.path.name + BAD_SUFFIX + "*") if p.name[-1:].isdigit()),
            key=lambda p: int(p.name.rpartition("-")[2]),
        )
        for old in kept[:-KEPT_BAD]:
            if old.is_symlink() or not old.is_dir():  # a directory is someone's: left alone
                with contextlib.suppress(OSError):
                    old.unlink()
        return str(aside)

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Write the prepared claims (atomically). Raises OSError: not written, or refused as larger
        than the reader takes."""
        entries = {
            uid: {k: v for k, v in asdict(c).items() if k != "uid" and (k != "made" or v)}
            for uid, c in sorted(claims.items())
        }
        text = json.dumps({"version": FORMAT, "claims": entries}, indent=1, sort_keys=True) + "\n"
        data = text.encode()
        if len(data) > MAX_CHECKPOINT_BYTES:
            raise OSError(
                f"checkpoint of {len(claims)} claims would be {len(data)} bytes, over the "
                f"{MAX_CHECKPOINT_BYTES} it is read back with; not written"
            )
        write_atomic(self.path, data, 0o600)


def _claim(uid: str, entry: Any) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(map(str, d["request_names"])),
            str(d["pool_name"]),
            str(d["device_name"]),
            tuple(map(str, d["cdi_device_ids"])),
        )
        for d in entry["devices"]
    )
    made = tuple(
        MadeMig(str(m["gpu_uuid"]), int(m["gi_id"]), str(m["uuid"]), str(m["device"]))
        for m in entry.get("made") or ()
    )
    return PreparedClaim(uid, str(entry["namespace"]), str(entry["name"]), devices, made)


_GPU_OF_DEVICE = re.compile(r"gpu-(\d+)(?:-|$)")


def dra_holds(directory: Path, gpus: Sequence[GpuInfo]) -> dict[str, str] | str:
    """For the device plugin: the claims holding GPUs through the DRA driver whose directory is
    `directory`, as its checkpoint says."""
    path = directory / CHECKPOINT_FILE
    by_minor = {gpu.minor: gpu.uuid for gpu in gpus}
    try:
        data = loads_json(read_bounded(path, MAX_CHECKPOINT_BYTES), max_bytes=MAX_CHECKPOINT_BYTES)
        if not isinstance(data, dict) or data.get("version") != FORMAT:
            raise ValueError(f"not an nvdp checkpoint (version {FORMAT})")
        holds: dict[str, str] = {}
        for uid, claim in dict(data["claims"]).items():
            holder = (
                f"claim {claim['namespace']}/{claim['name']}" if claim.get("namespace") else f"claim {uid}"
            )
            for device in claim["devices"]:
                name = str(device["device_name"])
                found = _GPU_OF_DEVICE.match(name)
                if found is None or int(found[1]) not in by_minor:
                    return f"{path}: device {name} names no GPU of this node"
                holds.setdefault(by_minor[int(found[1])], holder)
    except UnreadableFile as error:
        return str(error)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{path}: {error}"
    return holds
