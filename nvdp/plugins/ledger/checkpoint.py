"""Pod UIDs from the kubelet's device-manager checkpoint: what the PodResources API leaves out.

- The file is `kubelet_internal_checkpoint` in the device-plugin directory: one entry per container
  and resource, with the pod's UID, the container's name and the device IDs (a list, or since
  Kubernetes 1.20 a map of NUMA node to list).
- A device ID of one resource is held by one container at a time, so (resource, device ID,
  container) finds the UID of a holding the PodResources API reported.
- The file is the kubelet's: read bounded, never written; its checksum is not checked (the kubelet
  hashes Go structures), and an entry that does not match is not used.
- A file that cannot be read or parsed leaves the UIDs unknown.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from nvdp.base.bounded import loads_json
from nvdp.base.errors import NvdpError
from nvdp.base.files import read_bounded
from nvdp.plugins.ledger.types import Holding

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
MAX_CHECKPOINT_BYTES = 8 * 1024 * 1024

UidKey = tuple[str, str, str]  # (resource, device ID, container)


def parse_pod_uids(text: str | bytes) -> dict[UidKey, str]:
    """(resource, device ID, container) -> pod UID, from the checkpoint's text. Raises ValueError
    when it is no checkpoint; entries of another shape are skipped."""
    data = loads_json(text, max_bytes=MAX_CHECKPOINT_BYTES)
    entries = data.get("Data", {}).get("PodDeviceEntries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("no Data.PodDeviceEntries")
    uids: dict[UidKey, str] = {}
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        uid, container, resource = entry.get("PodUID"), entry.get("ContainerName"), entry.get("ResourceName")
        if not (isinstance(uid, str) and isinstance(container, str) and isinstance(resource, str)):
            continue
        for device_id in _device_ids(entry.get("DeviceIDs")):
            uids[(resource, device_id, container)] = uid
    return uids


def _device_ids(value: object) -> Iterable[str]:
    """A list of IDs (kubelets before 1.20) or NUMA node -> list of IDs."""
    lists = value.values() if isinstance(value, Mapping) else [value]
    return [i for ids in lists if isinstance(ids, list) for i in ids if isinstance(i, str)]


def read_pod_uids(path: Path) -> dict[UidKey, str]:
    """The UIDs the checkpoint at `path` names. Raises NvdpError (one line) when it cannot be read or
    parsed."""
    try:
        return parse_pod_uids(read_bounded(path, MAX_CHECKPOINT_BYTES))
    except NvdpError:
        raise
    except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise NvdpError(f"{path}: not a kubelet device checkpoint: {error}") from error


class CheckpointUids:
    """The UIDs of the checkpoint at `path`, parsed again only when the file changed (another inode,
    size or modification time: the kubelet replaces it whole on every change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._uids: dict[UidKey, str] = {}

    def read(self) -> dict[UidKey, str]:
        """Raises NvdpError (one line) when the file cannot be read or parsed."""
        try:
            st = os.stat(self.path)
        except OSError as error:
            raise NvdpError(f"{self.path}: {error.strerror or error}") from error
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if identity != self._seen:
            self._uids, self._seen = read_pod_uids(self.path), identity
        return self._uids


def with_uids(holdings: Iterable[Holding], uids: Mapping[UidKey, str]) -> list[Holding]:
    """The holdings, each with the UID the checkpoint gives its container's device (else as it is)."""
    found = []
    for h in holdings:
        uid = uids.get((h.resource, h.device_id, h.container))
        found.append(
            h if uid is None else Holding(h.resource, h.device_id, h.namespace, h.pod, h.container, uid)
        )
    return found
