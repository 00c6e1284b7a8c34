"""The reconcile loop of `nvdp config-manager`: each pass selects an entry and, when the effective file
differs from what the destination serves, validates it, swaps the link and signals once.

- Inputs: the node's label and annotations (Node watch, or one GET with --oneshot), the mounted
  ConfigMap (inotify on `..data`; `--poll-interval` only without inotify), the API's copy with
  --configmap-name (`sources` picks).
- A refusal is one log line (node, label value, reason) plus a Warning Event; the config stays
  until the label or ConfigMap changes. A failure to apply is reported so and retried with backoff
  (`retrying` feeds readiness). Each problem is reported once.
- Each applied config is recorded on the Node (`APPLIED_ANNOTATION`, `AppliedRecord`): a restarted
  pod whose label names no usable entry starts on it, as the emptyDir destination is lost.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nvdp.base.backoff import Backoff
from nvdp.base.dir_watch import IN_CLOSE_WRITE, DirWatcher
from nvdp.base.errors import CandidateError, NvdpError, SelectionError
from nvdp.base.logs import log_event
from nvdp.kube import Involved
from nvdp.side.configmanager import files, process
from nvdp.side.configmanager.selection import EMPTY, select
from nvdp.side.configmanager.settings import APPLIED_ANNOTATION, Settings
from nvdp.side.configmanager.sources import ConfigMapSources, Entries

log = logging.getLogger(__name__)

EVENT_REASON_REFUSED = "DevicePluginConfigRefused"
EVENT_REASON_APPLIED = "DevicePluginConfigApplied"
EVENT_REASON_FAILED = "DevicePluginConfigFailed"
RETRY_INITIAL_S = 1.0  # a config that could not be put in place: first retry, doubling up to
RETRY_MAX_S = 30.0


class NodeEvents(Protocol):
    def create_event(self, about: Involved, event_type: str, reason: str, message: str) -> None: ...


class AppliedRecord(Protocol):
    """Where the entry put in place is recorded for a restarted pod (the Node's annotation)."""

    def write(self, entry: str) -> None:
        """Record `entry` ("" = the empty config). Raises NvdpError."""
        ...


class _Failed(Exception):
    """A config could not be put in place for a reason a retry may fix (I/O)."""


@dataclass(frozen=True)
class Outcome:
    changed: bool  # the destination now serves a different file
    entry: str | None  # the entry served after this pass (None: nothing applied yet)
    problem: str | None = None


class ConfigManager:
    """One node's config selection. `reconcile()` runs a pass; `set_labels()` is thread-safe and
    wakes `run()`."""

    def __init__(
        self,
        settings: Settings,
        events: NodeEvents | None = None,
        record: AppliedRecord | None = None,
        *,
        retry_initial: float = RETRY_INITIAL_S,
        retry_max: float = RETRY_MAX_S,
    ) -> None:
        self.settings = settings
        configmap = f"{settings.namespace}/{settings.configmap_name}" if settings.configmap_name else ""
        self.sources = ConfigMapSources(settings.config_file_srcdir, configmap, self.wake)
        self._events = events
        self._record = record
        self._retry_initial, self._retry_max = retry_initial, retry_max
        self._label: str | None = None
        self._label_known = False
        self._recorded: str | None = None  # the Node's APPLIED_ANNOTATION (None: absent, or no Node)
        self._node_reads = 0  # Node states seen (set_labels): a write's answer is older than a later one
        self._node_present = False
        self._wake = threading.Event()
        self._watcher: DirWatcher | None = None  # while run() waits on the source directory
        self._lock = threading.Lock()
        self._reported: str | None = None
        self._record_reported: str | None = None
        self._to_record: str | None = None  # an entry put in place here and not recorded yet
        self.entry: str | None = None
        self.retrying: str | None = None  # why the selected config is not in place (a retry is due)
        self.signals_sent = 0
        self.applied_total = 0
        self.refused_total = 0
        # What the plugin was last given (the link target and a digest of the content then). The
        # destination is a link through the ConfigMap's ..data, so its content follows an edit: the
        # digest remembered here is what tells that the plugin has not seen the edit yet.
        self._applied: files.Effective | None = None
        self._baseline_taken = False

    # ---- inputs ----------------------------------------------------------------------------------

    def set_labels(self, labels: dict[str, str] | None, annotations: dict[str, str] | None = None) -> None:
        """The node's labels and annotations (labels None: the Node is gone). Wakes the loop when the
        label's value changed, or when the applied-entry annotation went (another pod's config-manager
        removed it at an uninstall of its own DaemonSet: this one records it again)."""
        value = (labels or {}).get(self.settings.node_label) or None
        recorded = (annotations or {}).get(APPLIED_ANNOTATION)
        with self._lock:
            changed = not self._label_known or value != self._label
            removed = self._recorded is not None and recorded is None
            self._label, self._label_known = value, True
            self._node_present = labels is not None
            self._recorded = recorded
            self._node_reads += 1
        if changed:
            log_event(log, logging.INFO, "node label", label=self.settings.node_label, value=value or "")
        if changed or removed:
            self.wake()

    @property
    def label(self) -> str | None:
        with self._lock:
            return self._label

    @property
    def recorded(self) -> str | None:
        """The entry the Node records as last put in place on it (None: none recorded)."""
        with self._lock:
            return self._recorded

    # ---- the loop --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconcile on each label change, each change in the source directory and each `wake()`,
        until `stop` is set (the setter calls `wake()` too). Where inotify is unavailable, the
        directory is re-read every poll interval instead. While a config could not be put in place
        or recorded, passes are retried with backoff (RETRY_INITIAL_S doubling to RETRY_MAX_S).

        No periodic safety re-read with inotify: every event in the directory wakes a full pass (a
        queue overflow too: it also makes the descriptor readable), events after a pass's start
        wake the next one, and the kubelet changes a ConfigMap volume only through that directory
        (new `..<timestamp>` dir, `..data` swap, entry links). Files written in place in a plain
        directory (not a ConfigMap volume) are seen too (IN_CLOSE_WRITE); SIGHUP forces a pass.
        """
        watcher = DirWatcher(Path(self.settings.config_file_srcdir), extra_events=IN_CLOSE_WRITE)
        self._watcher = watcher
        retries = Backoff(self._retry_initial, self._retry_max)
        try:
            while not stop.is_set():
                self._wake.clear()
                if self._label_known and self.sources.ready:
                    self.reconcile()
                if stop.is_set() or self._wake.is_set():
                    continue
                retry_in: float | None = None
                if self.retrying is not None or self._to_record is not None:
                    retry_in = retries.next()
                else:
                    retries.reset()
                if watcher.uses_inotify:
                    watcher.wait(retry_in)
                else:
                    poll = self.settings.poll_interval
                    self._wake.wait(poll if retry_in is None else min(poll, retry_in))
        finally:
            self._watcher = None
            watcher.close()

    def wake(self) -> bool:
        """Run a pass now (thread-safe). True when that made a pass pending (False: one already was)."""
        newly = not self._wake.is_set()
        self._wake.set()
        watcher = self._watcher
        if watcher is not None:
            watcher.wake()
        return newly

    def reconcile(self) -> Outcome:
        s = self.settings
        label = self.label
        if not self._baseline_taken:  # what the plugin read when it started (the init container's link)
            self._applied, self._baseline_taken = files.current(s.config_file_dst), True
        now = self._applied
        source = self.sources.entries()
        try:
            try:
                entries = source.names()
            except SelectionError as error:
                raise _Failed(str(error)) from error
            try:
                entry, wanted, content, note = self._choose(label, entries, source, first=now is None)
            except SelectionError as refused:
                self._report(label, str(refused))
                return Outcome(False, self.entry, str(refused))
            if now == wanted:
                self._clear()
                self.entry = entry
                self._record_entry()
                return Outcome(False, entry)
            try:
                if self.sources.copies and entry:
                    files.write_copy(s.config_file_dst, wanted.target, content)
                files.link(s.config_file_dst, wanted.target)
            except OSError as error:
                raise _Failed(f"cannot link {s.config_file_dst}: {error.strerror or error}") from error
            if self.sources.copies:  # the one replaced may have been resolved by a reader just now
                files.prune_copies(s.config_file_dst, {wanted.target, now.target if now else ""})
            self._applied = wanted
        except _Failed as failed:
            self._report(label, str(failed), retrying=True)
            self._record_entry()
            return Outcome(False, self.entry, str(failed))
        self._clear()
        if note is not None:  # the label's own pick was refused; the node got `entry` instead
            self._report(label, note)
        self.applied_total += 1
        previous, self.entry = self.entry, entry
        self._to_record = entry
        log_event(
            log,
            logging.INFO,
            "config applied",
            node=s.node_name,
            label=label or "",
            entry=entry or "(empty)",
            file=s.config_file_dst,
            target=wanted.target,
            source=source.source if self.sources.copies else None,
        )
        if previous is not None or now is not None:
            self._emit("Normal", EVENT_REASON_APPLIED, f"device plugin config {entry or '(empty)'} applied")
        if s.send_signal:
            self._signal()
        self._record_entry()
        return Outcome(True, entry)

    def _choose(
        self, label: str | None, entries: list[str], source: Entries, *, first: bool
    ) -> tuple[str, files.Effective, bytes, str | None]:
        """The entry to serve, its file and content, and (when the label's own pick was refused and
        another entry is served instead) the refusal to report. Raises SelectionError (a refusal:
        nothing to serve until the label or the ConfigMap changes) or _Failed (I/O: retry).

        With nothing in place yet (`first`: the init container, a restarted pod) a refused label
        must not leave the plugin without a config: the node gets the entry recorded as last put
        in place on it, else what it would get without the label; the label is still reported."""
        s = self.settings
        try:
            entry = select(label, entries, s.default_config, s.fallback_strategies)
            return (entry, *self._candidate(entry, source), None)
        except SelectionError as error:
            if not first:
                raise
            problem = str(error)
        fallbacks: list[tuple[str, str]] = []  # (entry, how it was found)
        recorded = self.recorded
        if recorded is not None:
            if recorded in entries or recorded == EMPTY:
                fallbacks.append((recorded, "the entry last applied on this node"))
            else:
                problem += f"; the entry last applied on this node, {recorded!r}, is not an entry any more"
        if label:
            try:
                fallbacks.append((select(None, entries, s.default_config, s.fallback_strategies), ""))
            except SelectionError as without:
                problem += f"; without the label: {without}"
        for entry, how in fallbacks:
            try:
                effective, content = self._candidate(entry, source)
            except SelectionError as refused:
                problem += f"; {refused}"
                continue
            using = entry or "the empty config"
            return entry, effective, content, f"{problem}; using {using}" + (f" ({how})" if how else "")
        raise SelectionError(problem)

    def _candidate(self, entry: str, source: Entries) -> tuple[files.Effective, bytes]:
        """The entry's file and content, validated unless the destination serves it already.
        Raises SelectionError (refused: not a file the plugin would take) or _Failed (a read that
        failed: retry)."""
        s = self.settings
        try:
            if not entry or not self.sources.copies:
                wanted, content = files.read_candidate(s.config_file_srcdir, entry)
            else:
                content = source.read(entry)
                target = files.copy_target(s.config_file_dst, entry, content)
                wanted = files.Effective(target, files.digest(content))
        except CandidateError as error:
            if _caused_by_os_error(error):  # a read that failed, not a file of the wrong kind or size
                raise _Failed(str(error)) from error
            raise SelectionError(str(error)) from error
        if wanted != self._applied:
            try:
                files.validate(entry, content, strict=self.settings.strict_config)
            except CandidateError as error:
                raise SelectionError(str(error)) from error
        return wanted, content

    # ---- outputs ---------------------------------------------------------------------------------

    def _record_entry(self) -> None:
        """Record the entry in place on the Node: one put in place here (until recorded), or the
        one in place when the Node records none yet. Never "corrects" another manager's record
        otherwise: the plugin's, GFD's and MPS's managers of one node would fight while one of
        their ConfigMap mounts lags. A failure is one WARNING line; the loop retries."""
        with self._lock:
            recorded, present, reads = self._recorded, self._node_present, self._node_reads
        wanted = self._to_record
        if wanted is None and recorded is None and self.entry is not None:
            wanted = self.entry
        if wanted is None or wanted == recorded or self._record is None or not present:
            self._to_record = None
            return
        try:
            self._record.write(wanted)
        except NvdpError as error:
            self._to_record = wanted
            if str(error) != self._record_reported:
                self._record_reported = str(error)
                log_event(
                    log,
                    logging.WARNING,
                    "cannot record the applied config on the node; retrying (a restarted pod whose label"
                    " names no usable entry starts on the last recorded one)",
                    entry=wanted or "(empty)",
                    error=str(error),
                )
            return
        with self._lock:
            if self._node_reads == reads:  # else the watch saw the Node since: maybe it went again
                self._recorded = wanted
        self._to_record = self._record_reported = None
        log_event(log, logging.INFO, "applied config recorded", annotation=APPLIED_ANNOTATION, entry=wanted)

    def _signal(self) -> None:
        s = self.settings
        sent = process.signal_by_name(s.process_to_signal, s.signal)
        if sent:
            self.signals_sent += 1
            log_event(log, logging.INFO, "signalled", process=s.process_to_signal, signal=s.signal, pids=sent)
        else:
            log_event(
                log,
                logging.WARNING,
                "no process to signal; it reads the file when it starts",
                process=s.process_to_signal,
            )

    def _report(self, label: str | None, reason: str, *, retrying: bool = False) -> None:
        self.retrying = reason if retrying else None
        if reason == self._reported:
            return
        self._reported = reason
        kept = self.entry if self.entry is not None else "(none yet)"
        if not retrying:
            self.refused_total += 1
        log_event(
            log,
            logging.ERROR,
            "config not applied; keeping the current config" + ("; retrying" if retrying else ""),
            node=self.settings.node_name,
            label=label or "",
            current=kept or "(empty)",
            reason=reason,
        )
        self._emit(
            "Warning",
            EVENT_REASON_FAILED if retrying else EVENT_REASON_REFUSED,
            f"label {self.settings.node_label}={label or ''}: {reason}",
        )

    def _clear(self) -> None:
        self._reported = None
        self.retrying = None

    def _emit(self, event_type: str, reason: str, message: str) -> None:
        if self._events is None:
            return
        try:
            self._events.create_event(Involved.node(self.settings.node_name), event_type, reason, message)
        except Exception as error:  # an event is best effort; the config work goes on
            log_event(log, logging.WARNING, "cannot create node event", reason=reason, error=str(error))


def _caused_by_os_error(error: BaseException) -> bool:
    cause = error.__cause__
    while cause is not None:
        if isinstance(cause, OSError):
            return True
        cause = cause.__cause__
    return False


__all__ = ["EMPTY", "AppliedRecord", "ConfigManager", "NodeEvents", "Outcome"]
