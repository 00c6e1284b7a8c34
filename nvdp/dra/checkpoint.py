"""The prepared claims on disk (`<kubelet plugins dir>/gpu.nvidia.com/checkpoint.json`), so that a
restarted plugin answers a repeated NodePrepareResources the same and can still unprepare.

One JSON object `{"version": "nvdp/v1", "claims": {uid: {namespace, name, devices: [...]}}}`, written
atomically (`nvdp.files.write_atomic`) after every change. A file that cannot be read or is not ours
(NVIDIA's driver writes its own format under the same name) is one WARNING line and is set aside as
`checkpoint.json.unreadable`; the plugin starts with no prepared claims.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvdp.bounded import loads_json
from nvdp.errors import UnreadableFile
from nvdp.files import read_bounded, write_atomic
from nvdp.logs import log_event

log = logging.getLogger(__name__)

FORMAT = "nvdp/v1"
MAX_CHECKPOINT_BYTES = 16 << 20


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answered it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """The prepared claims by UID; none when there is no file or it is unreadable (said once)."""
        if not self.path.exists():
            return {}
        try:
            data = loads_json(read_bounded(self.path, MAX_CHECKPOINT_BYTES), max_bytes=MAX_CHECKPOINT_BYTES)
            if not isinstance(data, dict) or data.get("version") != FORMAT:
                raise ValueError(f"not an nvdp checkpoint (version {FORMAT})")
            return {uid: _claim(uid, entry) for uid, entry in dict(data["claims"]).items()}
        except (UnreadableFile, ValueError, KeyError, TypeError) as error:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log_event(
                log,
                logging.WARNING,
                "checkpoint unreadable; starting with no prepared claims",
                path=str(self.path),
                error=str(error),
                kept_as=str(aside),
            )
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Write the prepared claims (atomically). Raises OSError."""
        entries = {
            uid: {k: v for k, v in asdict(c).items() if k != "uid"} for uid, c in sorted(claims.items())
        }
        text = json.dumps({"version": FORMAT, "claims": entries}, indent=1, sort_keys=True) + "\n"
        write_atomic(self.path, text.encode(), 0o600)


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
    return PreparedClaim(uid, str(entry["namespace"]), str(entry["name"]), devices)
