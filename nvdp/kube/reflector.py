"""List+watch with client-go's reflector's policy: the one watch loop of every nvdp watch (config-
manager's Node and ConfigMap, the DRA plugin's ResourceSlices); only `stop` ends it.

- It lists to `on_list`, watches from that resourceVersion to `on_event`; a watch the server ends
  resumes from the last version (at once if it ran, else after a wait).
- 410 Gone and other failures relist after a wait; a silent stream is watched again. Waits: 0.8 s
  doubling to 30 s, times [1, 2), reset only by two minutes without one (not by a success).
- Each watch asks for an end after [timeout_s, 2 timeout_s) (client-go: [5, 10) min); one silent
  past `silence_s` (plus the draw's excess) is dropped: a half-open connection shows within a minute.
- A malformed or foreign event, or one `on_event` cannot decode, is skipped: one WARNING per kind
  per `warn_every_s`, with a count.
- Failing for `alarm_after_s` logs one ERROR; `problem()` names it for /readyz until it recovers.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nvdp.base.backoff import Backoff
from nvdp.base.errors import KubeError, KubeGone, KubeWatchSilent
from nvdp.base.timers import TIMERS
from nvdp.kube.client import BadLine

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
ANOTHER_OBJECT = "another object"


@dataclass(frozen=True)
class WatchTimers:
    """The timers of one watch (seconds); the defaults are production's, tests shorten them."""

    timeout_s: int = 45  # each watch asks the server to end it after a draw from [t, 2t)
    silence_s: float = 60.0  # a watch asking `timeout_s` silent this long is dropped (plus the draw's excess)
    # the waits before a re-list, a re-watch after one that ended at once, and a retry after a failure:
    backoff_initial_s: float = TIMERS.watch_backoff  # from this (0.8 s: nvdp.base.timers),
    backoff_max_s: float = 30.0  # doubling to this, stretched by [1, 2)
    backoff_reset_s: float = 120.0  # re-list waits start over after this long without one
    short_watch_s: float = 1.0  # a watch ending sooner, with no event, ended "at once"
    alarm_after_s: float = 60.0  # failing this long: the ERROR line, and `problem()` says so
    warn_every_s: float = 600.0  # a skipped event's kind of problem is said at most once per this

    def __post_init__(self) -> None:
        if not self.silence_s > self.timeout_s:
            raise ValueError("silence_s must exceed timeout_s (a healthy watch ends before it)")


DEFAULT_TIMERS = WatchTimers()


def relist_backoff(
    timers: WatchTimers = DEFAULT_TIMERS,
    clock: Callable[[], float] = time.monotonic,
    uniform: Callable[[], float] = random.random,
) -> Backoff:
    """The waits before a re-list (and a re-watch after a watch that ended at once), as client-go's
    reflector makes them (see the module)."""
    return Backoff(
        timers.backoff_initial_s,
        timers.backoff_max_s,
        jitter=1.0,
        reset_after=timers.backoff_reset_s,
        clock=clock,
        uniform=uniform,
    )


class ListWatch(Protocol):
    """The requests of one watched collection: a list (its items and resourceVersion) and a watch from
    a resourceVersion (its raw events, decoded JSON; an ERROR event raises KubeStatusError, KubeGone
    for 410)."""

    def list(self) -> tuple[Iterable[object], str]: ...

    def watch(self, since: str, *, timeout_seconds: int, silence: float) -> Generator[object, None, None]: ...


class Reflector:
    """List+watch `source` until `stop` (see the module). `ours(obj)` tells the watched objects from
    others; `on_list(items)` gets a list's (well-formed, ours), `on_event(type, obj)` each event's
    (not BOOKMARKs). `on_failure(message, failing_for_s)` hears each failure and `on_recovered()` the
    first success after. `kind` and `subject` name the watch in log lines (`<kind> watch failed
    <kind>=<subject> ...`), `consequence` says in the ERROR line what does not work meanwhile."""

    def __init__(
        self,
        source: ListWatch,
        *,
        kind: str,
        subject: str,
        consequence: str,
        ours: Callable[[Obj], bool],
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        object_kind: str | None = None,
        timers: WatchTimers = DEFAULT_TIMERS,
        on_failure: Callable[[str, float], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        logger: logging.Logger = log,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._source = source
        self.kind, self._subject, self._consequence = kind, subject, consequence
        self._ours, self._on_list, self._on_event = ours, on_list, on_event
        self._object_kind = object_kind
        self.timers = timers
        self._on_failure, self._on_recovered = on_failure, on_recovered
        self._log = logger
        self._clock, self._uniform = clock, uniform
        self._waits = relist_backoff(timers, clock, uniform)  # every wait: one backoff, as client-go's
        self.failing_since: float | None = None  # clock of the first failure in a row
        self.last_error = ""
        self._alarmed = False
        self.lists = 0  # lists done (the first, one after each 410 Gone)
        self.watches = 0  # watch requests made
        self.skipped = 0  # events skipped (malformed, another object's)
        self._said: dict[str, tuple[float, int]] = {}  # problem -> (when said, skipped since)

    def problem(self) -> str | None:
        """Why this watch counts as dead (failing for `alarm_after_s`); None while it works."""
        since = self.failing_since
        if since is None:
            return None
        failing = self._clock() - since
        if failing < self.timers.alarm_after_s:
            return None
        return f"{self.kind} watch failing for {failing:.0f}s: {self.last_error}"

    def run(self, stop: threading.Event) -> None:
        """List+watch until `stop` is set (checked between requests and between events); a request
        that ends once it is set is no failure (not said)."""
        version: str | None = None
        while not stop.is_set():
            since: float | None = None  # when the failure began, where known before now
            try:
                if version is None:
                    version = self._list()
                version, ran = self._watch(version, stop)
                if stop.is_set():  # ended by the stop (its streams closed): no failure
                    return
                if ran:  # it worked: resumed from where it ended, at once
                    self._recovered()
                    continue
                wait = self._waits.next()
                self._failed(
                    f"watch ended at once (no event within {self.timers.short_watch_s:g}s)", None, wait
                )
                stop.wait(wait)
                continue
            except KubeGone:
                if stop.is_set():
                    return
                wait = self._waits.next()
                self._log.info(
                    "%s watch expired (410 Gone); listing again %s=%s in=%.1fs",
                    self.kind,
                    self.kind,
                    self._subject,
                    wait,
                )
                version = None
                stop.wait(wait)
                continue
            except KubeWatchSilent as error:  # watched again from where it was
                message, since = str(error), error.last_heard
            except KubeError as error:  # connection refused, error statuses: listed again, as client-go does
                message, version = str(error), None
            except (KeyError, TypeError, ValueError, AttributeError) as error:  # a list without what one has
                message = f"unexpected answer: {type(error).__name__} {error}"
            if stop.is_set():  # a request the stop cut short (its server gone): no failure
                return
            delay = self._waits.next()
            self._failed(message, since, delay)
            stop.wait(delay)

    # ---- one list, one watch ----------------------------------------------------------------------

    def _list(self) -> str:
        items, version = self._source.list()
        if not version:
            raise ValueError("a list without metadata.resourceVersion")
        self.lists += 1
        kept = []
        for item in items:
            problem = self._object_problem(item, "item")
            if problem is None:
                kept.append(item)
            else:
                self._skip(problem, item)
        self._recovered()  # before the items are handed on: who sees them sees the watch working
        self._on_list(kept)  # type: ignore[arg-type]
        return version

    def _watch(self, version: str, stop: threading.Event) -> tuple[str, bool]:
        """One watch from `version` until the server ends it: the last version seen, and whether it ran
        (an event came, or it lasted `short_watch_s`)."""
        t = self.timers
        timeout = int(t.timeout_s * (1 + self._uniform()))
        started, heard = self._clock(), False
        self.watches += 1
        events = self._source.watch(
            version, timeout_seconds=timeout, silence=t.silence_s + timeout - t.timeout_s
        )
        try:
            for raw in events:
                checked = self._checked(raw)
                if checked is None:
                    continue
                kind, obj, version, ours = checked
                heard = True
                self._recovered()
                if kind != "BOOKMARK" and ours:
                    self._apply(kind, obj)
                if stop.is_set():
                    break
        finally:
            events.close()  # left early: the stream's connection is closed, not reused
        return version, heard or self._clock() - started >= t.short_watch_s

    def _checked(self, raw: object) -> tuple[str, Obj, str, bool] | None:
        """The event's type, object, resourceVersion and whether the object is the one watched (another
        object's event moves the resourceVersion on, its content is skipped); None (said) when the
        event is to be skipped whole."""
        if isinstance(raw, BadLine):
            self._skip("no JSON", f"{raw.reason}: {raw.text}")
            return None
        if not isinstance(raw, Mapping):
            self._skip("not an object", raw)
            return None
        kind, obj = raw.get("type"), raw.get("object")
        if kind not in EVENT_TYPES:
            self._skip("unknown event type", kind)
            return None
        if not isinstance(obj, Mapping):
            self._skip("no object", raw)
            return None
        metadata = obj.get("metadata")
        version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
        if not isinstance(version, str) or not version:
            self._skip("no metadata.resourceVersion", raw)
            return None
        problem = None if kind == "BOOKMARK" else self._object_problem(obj, "event")
        if problem is not None:
            self._skip(problem, obj)
            if problem != ANOTHER_OBJECT:
                return None
        return str(kind), dict(obj), version, problem is None

    def _object_problem(self, obj: object, what: str) -> str | None:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("metadata"), Mapping):
            return f"{what} without metadata"
        found = obj.get("kind")
        if self._object_kind is not None and found is not None and found != self._object_kind:
            return f"{what} of kind {found}"
        if not self._ours(dict(obj)):
            return ANOTHER_OBJECT
        return None

    def _apply(self, kind: str, obj: Obj) -> None:
        try:
            self._on_event(kind, obj)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            self._skip("undecodable object", f"{type(error).__name__}: {error}")

    def _skip(self, problem: str, what: object) -> None:
        """Count a skipped event; say its kind of problem once per `warn_every_s`."""
        self.skipped += 1
        now = self._clock()
        said, since = self._said.get(problem, (None, 0))
        if said is not None and now - said < self.timers.warn_every_s:
            self._said[problem] = (said, since + 1)
            return
        self._said[problem] = (now, 0)
        detail = " ".join((what if isinstance(what, str) else repr(what)).split())
        self._log.warning(
            "%s watch event skipped %s=%s problem=%r skipped_before=%d event=%s",
            self.kind,
            self.kind,
            self._subject,
            problem,
            since,
            detail if len(detail) <= 200 else detail[:197] + "...",
        )

    # ---- failing and recovering -----------------------------------------------------------------

    def _failed(self, message: str, since: float | None, delay: float) -> None:
        now = self._clock()
        self.last_error = message
        if self.failing_since is None:
            self.failing_since = since if since is not None else now
        failing_for = now - self.failing_since
        if failing_for >= self.timers.alarm_after_s and not self._alarmed:
            self._alarmed = True
            self._log.error(
                "%s watch has been failing %s=%s for=%.0fs error=%r; %s",
                self.kind,
                self.kind,
                self._subject,
                failing_for,
                message,
                self._consequence,
            )
        else:
            self._log.warning(
                "%s watch failed %s=%s error=%r retry_in=%.1fs",
                self.kind,
                self.kind,
                self._subject,
                message,
                delay,
            )
        if self._on_failure is not None:
            self._on_failure(message, failing_for)

    def _recovered(self) -> None:
        if self.failing_since is None:
            return
        self._log.info(
            "%s watch recovered %s=%s after=%.1fs",
            self.kind,
            self.kind,
            self._subject,
            self._clock() - self.failing_since,
        )
        self.failing_since = None
        self._alarmed = False
        if self._on_recovered is not None:
            self._on_recovered()
