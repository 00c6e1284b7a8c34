"""The config-manager's list+watch of its own Node: resumed, re-listed with client-go's backoff,
dropped when silent, retried on every failure, never stopped (the requests: `nvdp.kube`).

Each watch asks the server to end it after WATCH_TIMEOUT_S (it is then resumed from the last
resourceVersion, no list), so a healthy server always says something within WATCH_SILENCE_S; a
stream silent that long is taken for dead (a half-open connection, a stalled server) and dropped.
HTTP/1.1 has no pings: this read timeout is how silence is told from quiet, where client-go's HTTP/2
transport sends a ping after 30 s of silence and gives up 15 s later.

Between one list+watch cycle and the next (after a 410 Gone) the wait is client-go's reflector's:
0.8 s doubling to 30 s, each wait stretched by a random factor in [1, 2), starting over at 0.8 s
once two minutes passed without a wait.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from nvdp import kube
from nvdp.backoff import Backoff
from nvdp.errors import KubeError, KubeGone, KubeWatchSilent

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 45
WATCH_SILENCE_S = 60.0
RELIST_INITIAL_S = 0.8
RELIST_MAX_S = 30.0
RELIST_RESET_S = 120.0


def relist_backoff(
    clock: Callable[[], float] = time.monotonic, uniform: Callable[[], float] = random.random
) -> Backoff:
    """The waits between list+watch cycles, as client-go's reflector makes them (see the module)."""
    return Backoff(
        RELIST_INITIAL_S, RELIST_MAX_S, jitter=1.0, reset_after=RELIST_RESET_S, clock=clock, uniform=uniform
    )


class NodeWatch:
    """List+watch one Node (field selector metadata.name=<node>) and hand it to `on_node` (None when
    the Node is gone). Resumes from the last resourceVersion after the server ends a watch; re-lists
    on 410 Gone after a wait from `relist_backoff()` (a server that answers every watch with 410 gets
    a list every 30-60 s, not dozens a second); drops a stream silent for `silence_timeout` s;
    retries every other failure with capped exponential backoff and never stops until `stop` is
    set. `on_failure(message, failing_for_seconds)` hears each failure; a line is logged at WARNING,
    and at ERROR once the watch has been failing (or silent) for `alarm_after` s. The client should
    make no retries of its own (`kube.new_api_client(retries=0)`): each would add a whole
    `silence_timeout` before a failure is seen.
    """

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        on_node: Callable[[kube.NodeMeta | None], None],
        *,
        on_failure: Callable[[str, float], None] | None = None,
        timeout_seconds: int = WATCH_TIMEOUT_S,
        silence_timeout: float = WATCH_SILENCE_S,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        alarm_after: float = 60.0,
    ) -> None:
        if not silence_timeout > timeout_seconds:
            raise ValueError("silence_timeout must exceed timeout_seconds (a healthy watch ends before it)")
        self._api_client = api_client
        self._node = node_name
        self._on_node = on_node
        self._on_failure = on_failure
        self._timeout_seconds = timeout_seconds
        self._silence = silence_timeout
        self._retries = Backoff(backoff_initial, backoff_max)  # after a failure; reset by a success
        self._relists = relist_backoff()
        self._alarm_after = alarm_after
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.lists = 0  # full lists done (the first, and one after each 410 Gone)

    @property
    def selector(self) -> str:
        return f"metadata.name={self._node}"

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set (checked between requests and events)."""
        version: str | None = None
        alarmed = False
        while not stop.is_set():
            since: float | None = None  # when the failure began, where known before now
            try:
                if version is None:
                    query = {"fieldSelector": self.selector}
                    nodes = kube.get_json(self._api_client, "/api/v1/nodes", query, 30)
                    self.lists += 1
                    items = nodes.get("items") or []
                    self._on_node(kube.NodeMeta.of(items[0]) if items else None)
                    version = str(nodes["metadata"]["resourceVersion"])
                    self._recovered()
                    alarmed = False
                    self._retries.reset()
                version = self._watch(version, stop)
                self._recovered()
                alarmed = False
                self._retries.reset()
                continue
            except KubeGone:
                wait = self._relists.next()
                log.info("node watch expired (410 Gone); listing again node=%s in=%.1fs", self._node, wait)
                version = None
                stop.wait(wait)
                continue
            except KubeWatchSilent as error:
                message, since = str(error), error.last_heard
            except KubeError as error:  # connection refused, timeouts, error statuses: retry, never stop
                message = str(error)
            except (KeyError, TypeError, ValueError) as error:  # an answer without what a list has
                message = f"unexpected answer: {type(error).__name__} {error}"
            now, delay = time.monotonic(), self._retries.next()
            if self.failing_since is None:
                self.failing_since = since if since is not None else now
            failing_for = now - self.failing_since
            if failing_for >= self._alarm_after and not alarmed:
                alarmed = True
                log.error(
                    "node watch has been failing node=%s for=%.0fs error=%r; the config is not following"
                    " the node label until it recovers",
                    self._node,
                    failing_for,
                    message,
                )
            else:
                log.warning("node watch failed node=%s error=%r retry_in=%.1fs", self._node, message, delay)
            if self._on_failure is not None:
                self._on_failure(message, failing_for)
            stop.wait(delay)

    def _watch(self, version: str, stop: threading.Event) -> str:
        """One watch request from `version` until the server ends it; the last version seen."""
        query = {
            "fieldSelector": self.selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._timeout_seconds),
            "watch": "true",
        }
        events = kube.watch(self._api_client, "/api/v1/nodes", query, silence=self._silence)
        try:
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                self._recovered()
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "DELETED":
                    self._on_node(None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._on_node(kube.NodeMeta.of(obj))
                if stop.is_set():
                    break
        finally:
            events.close()  # left early: the stream's connection is closed, not reused
        return version

    def _recovered(self) -> None:
        if self.failing_since is not None:
            log.info(
                "node watch recovered node=%s after=%.1fs", self._node, time.monotonic() - self.failing_since
            )
            self.failing_since = None
