"""Which copy of the ConfigMap's entries a pass reads: the mounted directory (the kubelet's, 20-80 s
after an edit) or, with --configmap-name, the API's (watched by name: within a second).

- The API's copy is used once the watch delivered it.
- The mount is the fallback before the API served the ConfigMap (unreachable, forbidden, missing),
  and while it is ahead: it changed, while the watch failed, to entries the API never showed.
- It stays ahead until the API shows the same entries or a fresh list answers (a resumed watch
  replays older events first).
- A lagging mount (entries the API showed before, those of the first look, or any it shows while
  the watch is heard) never replaces newer API entries, so the two never take turns.
- A deleted ConfigMap keeps the entries last served, as the kubelet keeps the mounted files.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from nvdp.base.errors import CandidateError, SelectionError
from nvdp.base.files import MAX_FILE_BYTES
from nvdp.base.logs import log_event
from nvdp.base.units import describe_size
from nvdp.kube.configmaps import ConfigMapData
from nvdp.side.configmanager import files
from nvdp.side.configmanager.selection import list_entries

log = logging.getLogger(__name__)

HISTORY = 64  # the API's entries remembered (by fingerprint) to tell a lagging mount from one ahead
_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")  # a ConfigMap key (the API server allows no other)


class Entries(Protocol):
    """The entries of one copy of the ConfigMap."""

    @property
    def source(self) -> str:
        """ "mount" or "api"."""
        ...

    def names(self) -> list[str]:
        """The entry names, sorted. Raises SelectionError."""
        ...

    def read(self, entry: str) -> bytes:
        """An entry's content. Raises CandidateError (caused by an OSError where a read failed)."""
        ...


class MountedEntries:
    """The mounted directory (`--config-file-srcdir`), read as the plugin reads its file."""

    source = "mount"

    def __init__(self, srcdir: str) -> None:
        self._srcdir = srcdir

    def names(self) -> list[str]:
        return list_entries(self._srcdir)

    def read(self, entry: str) -> bytes:
        return files.read_candidate(self._srcdir, entry)[1]


class ApiEntries:
    """The ConfigMap as the API served it."""

    source = "api"

    def __init__(self, data: ConfigMapData) -> None:
        self.data = data

    def names(self) -> list[str]:
        return sorted(k for k in self.data.entries if _is_entry(k))

    def read(self, entry: str) -> bytes:
        content = self.data.entries.get(entry)
        if content is None or not _is_entry(entry):
            raise CandidateError(f"cannot read entry {entry!r}: not in the ConfigMap")
        if len(content) > MAX_FILE_BYTES:
            raise CandidateError(f"cannot read entry {entry!r}: larger than {describe_size(MAX_FILE_BYTES)}")
        return content


def _is_entry(key: str) -> bool:
    """A key the kubelet writes as a file of the volume (the API server allows no other)."""
    return bool(_KEY.fullmatch(key)) and not key.startswith("..") and key != "."


def fingerprint(entries: Entries) -> str:
    """A digest of every entry's name and content (or why it cannot be read). Raises SelectionError
    (the entries cannot be listed)."""
    digest = hashlib.sha256()
    for name in entries.names():
        try:
            part = files.digest(entries.read(name))
        except CandidateError as error:
            part = f"unreadable: {error}"
        digest.update(f"{name}\0{part}\0".encode())
    return digest.hexdigest()


class ConfigMapSources:
    """The copy a pass reads (`entries()`, from the reconcile loop) and the API's copy (`set_api`,
    `api_failed`, `api_recovered`: the watch's callbacks, from its thread; they call `wake` when a
    pass is due). `configmap` ("namespace/name") names the ConfigMap watched; "" reads the mount
    only, as NVIDIA's config-manager does."""

    def __init__(self, srcdir: str, configmap: str, wake: Callable[[], object]) -> None:
        self.configmap = configmap
        self._wake = wake
        self._mount = MountedEntries(srcdir)
        self._lock = threading.Lock()
        self._api: ConfigMapData | None = None
        self._heard = not configmap  # the API answered (or failed) once: a first pass may run
        self._failing = False  # the watch failed and has not been heard since
        self._absent_reported = False
        self._history: OrderedDict[str, str] = OrderedDict()  # the API's entries seen: fingerprint -> version
        self._mount_print: str | None = None  # the mount's entries at the last pass
        self._mount_ahead = False
        self._using: str | None = None

    @property
    def copies(self) -> bool:
        """Entries are copied into the destination's directory (the API's entries have no file)."""
        return bool(self.configmap)

    @property
    def ready(self) -> bool:
        """A pass may run: without the API, or once it answered or failed (a first pass on the
        mount alone would put a lagging entry in place only to replace it a moment later)."""
        with self._lock:
            return self._heard

    def set_api(self, data: ConfigMapData | None, listed: bool) -> None:
        """The ConfigMap as the API serves it (None: there is none); `listed`: from a list, so the
        state now."""
        with self._lock:
            due, self._heard, self._failing = not self._heard, True, False
            if data is None:
                if not self._absent_reported:
                    self._absent_reported = True
                    kept = "keeping the entries last served" if self._api else "reading the mounted copy"
                    log_event(
                        log, logging.WARNING, f"ConfigMap not in the API; {kept}", configmap=self.configmap
                    )
            else:
                self._absent_reported = False
                due = due or self._api is None or data.entries != self._api.entries
                self._api = data
                printed = fingerprint(ApiEntries(data))
                self._history[printed] = data.version
                self._history.move_to_end(printed)
                while len(self._history) > HISTORY:
                    self._history.popitem(last=False)
                if self._mount_ahead and (listed or printed == self._mount_print):
                    self._mount_ahead, due = False, True
        if due:
            self._wake()

    def api_failed(self, message: str = "", failing_for: float = 0.0) -> None:
        """The watch failed (it retries; meanwhile the mount may get ahead)."""
        with self._lock:
            first, self._heard, self._failing = not self._heard, True, True
        if first:  # the first pass runs on the mount
            self._wake()

    def api_recovered(self) -> None:
        """The watch is heard again (what it missed follows as events)."""
        with self._lock:
            self._failing = False

    def entries(self) -> Entries:
        """The copy this pass reads (see the module)."""
        if not self.configmap:
            return self._mount
        try:
            mount_print: str | None = fingerprint(self._mount)
        except SelectionError:
            mount_print = None  # unreadable: the API's copy, where there is one
        with self._lock:
            if mount_print is not None and mount_print != self._mount_print:
                if mount_print in self._history:
                    self._mount_ahead = False
                elif self._mount_print is not None and self._failing:
                    self._mount_ahead = True
                self._mount_print = mount_print
            api, ahead = self._api, self._mount_ahead
        chosen: Entries = self._mount if api is None or ahead else ApiEntries(api)
        if chosen.source != self._using:
            self._using = chosen.source
            if api is not None and not ahead:
                where, why = "the API", f"resourceVersion {api.version}"
            elif api is None:
                where, why = "the mounted volume", "the API has not served the ConfigMap"
            else:
                where, why = "the mounted volume", "it shows entries the API has not (the watch is failing)"
            log_event(
                log, logging.INFO, f"reading config entries from {where}", configmap=self.configmap, why=why
            )
        return chosen
