"""The reconcile loop of `nvdp config-manager`.

Inputs: the node's label value (from the Node watch thread, or one GET with --oneshot) and the
mounted ConfigMap directory (watched with inotify: the kubelet's update of a ConfigMap swaps the
`..data` link in it, so an edit of the ConfigMap is applied without a restart and nothing wakes while
nothing changes; re-read every `--poll-interval` only where inotify is unavailable). Each pass
selects an entry, reads it, and when the effective file (link target or content) differs from what
the destination serves: validates it with the plugin's loader and support rules, swaps the symlink
and signals the plugin once. A problem (unknown label value, unreadable or invalid
entry) is one log line naming the node, label value and reason, plus a Warning Event on the Node;
the current config stays and watching goes on. The same problem is reported once, not every pass.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nvdp.configmanager import files, process
from nvdp.configmanager.selection import EMPTY, list_entries, select
from nvdp.configmanager.settings import Settings
from nvdp.errors import NvdpError, SelectionError
from nvdp.logs import log_event
from nvdp.plugin.watch import IN_CLOSE_WRITE, DirWatcher

log = logging.getLogger(__name__)

EVENT_REASON_REFUSED = "DevicePluginConfigRefused"
EVENT_REASON_APPLIED = "DevicePluginConfigApplied"


class NodeEvents(Protocol):
    def create_node_event(self, event_type: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class Outcome:
    changed: bool  # the destination now serves a different file
    entry: str | None  # the entry served after this pass (None: nothing applied yet)
    problem: str | None = None


class ConfigManager:
    """One node's config selection. `reconcile()` runs a pass; `set_label()` is thread-safe and
    wakes `run()`."""

    def __init__(self, settings: Settings, events: NodeEvents | None = None) -> None:
        self.settings = settings
        self._events = events
        self._label: str | None = None
        self._label_known = False
        self._wake = threading.Event()
        self._watcher: DirWatcher | None = None  # while run() waits on the source directory
        self._lock = threading.Lock()
        self._reported: str | None = None
        self.entry: str | None = None
        self.signals_sent = 0
        self.applied_total = 0
        self.refused_total = 0
        # What the plugin was last given (the link target and a digest of the content then). The
        # destination is a link through the ConfigMap's ..data, so its content follows an edit: the
        # digest remembered here is what tells that the plugin has not seen the edit yet.
        self._applied: files.Effective | None = None
        self._baseline_taken = False

    # ---- inputs ----------------------------------------------------------------------------------

    def set_labels(self, labels: dict[str, str] | None) -> None:
        """The node's labels (None: the Node is gone). Wakes the loop when the value changed."""
        value = (labels or {}).get(self.settings.node_label) or None
        with self._lock:
            changed = not self._label_known or value != self._label
            self._label, self._label_known = value, True
        if changed:
            log_event(log, logging.INFO, "node label", label=self.settings.node_label, value=value or "")
            self.wake()

    @property
    def label(self) -> str | None:
        with self._lock:
            return self._label

    # ---- the loop --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconcile on each label change, each change in the source directory and each `wake()`,
        until `stop` is set (the setter calls `wake()` too). Where inotify is unavailable, the
        directory is re-read every poll interval instead.

        No periodic safety re-read with inotify: every event in the directory wakes a full pass (a
        queue overflow too: it also makes the descriptor readable), events after a pass's start
        wake the next one, and the kubelet changes a ConfigMap volume only through that directory
        (new `..<timestamp>` dir, `..data` swap, entry links). Files written in place in a plain
        directory (not a ConfigMap volume) are seen too (IN_CLOSE_WRITE); SIGHUP forces a pass.
        """
        watcher = DirWatcher(Path(self.settings.config_file_srcdir), extra_events=IN_CLOSE_WRITE)
        self._watcher = watcher
        try:
            while not stop.is_set():
                self._wake.clear()
                if self._label_known:
                    self.reconcile()
                if stop.is_set() or self._wake.is_set():
                    continue
                if watcher.uses_inotify:
                    watcher.wait(None)
                else:
                    self._wake.wait(self.settings.poll_interval)
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
        try:
            entries = list_entries(s.config_file_srcdir)
            try:
                entry = select(label, entries, s.default_config, s.fallback_strategies)
            except SelectionError as error:
                if now is not None or not label:
                    raise
                # Nothing served yet (first start): a bad label must not leave the plugin without a
                # config; use what the node would get without the label, and still report the label.
                try:
                    entry = select(None, entries, s.default_config, s.fallback_strategies)
                except SelectionError as fallback:
                    raise SelectionError(f"{error}; without the label: {fallback}") from fallback
                self._report(label, f"no config entry named {label!r}; using {entry or 'the empty config'}")
            wanted, content = files.read_candidate(s.config_file_srcdir, entry)
            if now == wanted:
                self._clear()
                self.entry = entry
                return Outcome(False, entry)
            files.validate(entry, content, strict=s.strict_config)
            files.link(s.config_file_dst, wanted.target)
            self._applied = wanted
        except (NvdpError, OSError) as error:
            reason = str(error) if isinstance(error, NvdpError) else f"{error.strerror or error}"
            self._report(label, reason)
            return Outcome(False, self.entry, reason)
        self._clear()
        self.applied_total += 1
        previous, self.entry = self.entry, entry
        log_event(
            log,
            logging.INFO,
            "config applied",
            node=s.node_name,
            label=label or "",
            entry=entry or "(empty)",
            file=s.config_file_dst,
            target=wanted.target,
        )
        if previous is not None or now is not None:
            self._emit("Normal", EVENT_REASON_APPLIED, f"device plugin config {entry or '(empty)'} applied")
        if s.send_signal:
            self._signal()
        return Outcome(True, entry)

    # ---- outputs ---------------------------------------------------------------------------------

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

    def _report(self, label: str | None, reason: str) -> None:
        if reason == self._reported:
            return
        self._reported = reason
        self.refused_total += 1
        kept = self.entry if self.entry is not None else "(none yet)"
        log_event(
            log,
            logging.ERROR,
            "config not applied; keeping the current config",
            node=self.settings.node_name,
            label=label or "",
            current=kept or "(empty)",
            reason=reason,
        )
        self._emit(
            "Warning", EVENT_REASON_REFUSED, f"label {self.settings.node_label}={label or ''}: {reason}"
        )

    def _clear(self) -> None:
        self._reported = None

    def _emit(self, event_type: str, reason: str, message: str) -> None:
        if self._events is None:
            return
        try:
            self._events.create_node_event(event_type, reason, message)
        except Exception as error:  # an event is best effort; the config work goes on
            log_event(log, logging.WARNING, "cannot create node event", reason=reason, error=str(error))


__all__ = ["EMPTY", "ConfigManager", "NodeEvents", "Outcome"]
