"""The config-manager's list+watch of one named object (its own Node; the ConfigMap it reads):
resumed, re-listed with client-go's backoff, dropped when silent, retried on every failure, never
stopped (the requests: `nvdp.kube`).

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
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from nvdp import kube
from nvdp.backoff import Backoff
from nvdp.errors import KubeError, KubeGone, KubeWatchSilent
from nvdp.kube.configmaps import ConfigMapData, configmaps_path

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 45
WATCH_SILENCE_S = 60.0
RELIST_INITIAL_S = 0.8
RELIST_MAX_S = 30.0
RELIST_RESET_S = 120.0

T = TypeVar("T")


def relist_backoff(
    clock: Callable[[], float] = time.monotonic, uniform: Callable[[], float] = random.random
) -> Backoff:
    """The waits between list+watch cycles, as client-go's reflector makes them (see the module)."""
    return Backoff(
        RELIST_INITIAL_S, RELIST_MAX_S, jitter=1.0, reset_after=RELIST_RESET_S, clock=clock, uniform=uniform
    )


class ObjectWatch(Generic[T]):
    """List+watch the object `name` of the collection at `path` (field selector metadata.name=<name>)
    and hand it, decoded, to `on_object(obj, listed)` (obj None when there is no such object; `listed`:
    it comes from a list, so it is the object's state now, not an event a resumed watch replays).
    Resumes from the last resourceVersion after the server ends a watch; re-lists on 410 Gone after a
    wait from `relist_backoff()` (a server that answers every watch with 410 gets a list every 30-60 s,
    not dozens a second); drops a stream silent for `silence_timeout` s; retries every other failure
    with capped exponential backoff and never stops until `stop` is set. `on_failure(message,
    failing_for_seconds)` hears each failure, and `on_recovered()` the first success after; a line
    is logged at WARNING, and at ERROR once the watch has been failing (or silent) for `alarm_after`
    s. The client should make no retries of its own (`kube.new_api_client(retries=0)`): each would
    add a whole `silence_timeout` before a failure is seen. `kind` names the object in log lines
    (`<kind> watch failed <kind>=<subject> ...`), and `consequence` says in the alarm line what does
    not work meanwhile.
    """

    def __init__(
        self,
        api_client: Any,
        path: str,
        name: str,
        decode: Callable[[Mapping[str, Any]], T],
        on_object: Callable[[T | None, bool], None],
        *,
        kind: str,
        subject: str,
        consequence: str,
        on_failure: Callable[[str, float], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        timeout_seconds: int = WATCH_TIMEOUT_S,
        silence_timeout: float = WATCH_SILENCE_S,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        alarm_after: float = 60.0,
    ) -> None:
        if not silence_timeout > timeout_seconds:
            raise ValueError("silence_timeout must exceed timeout_seconds (a healthy watch ends before it)")
        self._api_client = api_client
        self._path, self._name, self._decode, self._on_object = path, name, decode, on_object
        self.kind, self._subject, self._consequence = kind, subject, consequence
        self._on_failure, self._on_recovered = on_failure, on_recovered
        self._timeout_seconds = timeout_seconds
        self._silence = silence_timeout
        self._retries = Backoff(backoff_initial, backoff_max)  # after a failure; reset by a success
        self._relists = relist_backoff()
        self._alarm_after = alarm_after
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.lists = 0  # full lists done (the first, and one after each 410 Gone)

    @property
    def selector(self) -> str:
        return f"metadata.name={self._name}"

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set (checked between requests and events)."""
        version: str | None = None
        alarmed = False
        while not stop.is_set():
            since: float | None = None  # when the failure began, where known before now
            try:
                if version is None:
                    found = kube.get_json(self._api_client, self._path, {"fieldSelector": self.selector}, 30)
                    self.lists += 1
                    items = found.get("items") or []
                    self._on_object(self._decode(items[0]) if items else None, True)
                    version = str(found["metadata"]["resourceVersion"])
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
                log.info(
                    "%s watch expired (410 Gone); listing again %s=%s in=%.1fs",
                    self.kind,
                    self.kind,
                    self._subject,
                    wait,
                )
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
                    "%s watch has been failing %s=%s for=%.0fs error=%r; %s",
                    self.kind,
                    self.kind,
                    self._subject,
                    failing_for,
                    message,
                    self._consequence,
                )
            else:
                log.warning(
                    "%s watch failed %s=%s error=%r retry_in=%.1fs",
                    self.kind,
                    self.kind,
                    self._subject,
                    message,
                    delay,
                )
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
        events = kube.watch(self._api_client, self._path, query, silence=self._silence)
        try:
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                self._recovered()
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "DELETED":
                    self._on_object(None, False)
                elif kind in ("ADDED", "MODIFIED"):
                    self._on_object(self._decode(obj), False)
                if stop.is_set():
                    break
        finally:
            events.close()  # left early: the stream's connection is closed, not reused
        return version

    def _recovered(self) -> None:
        if self.failing_since is not None:
            log.info(
                "%s watch recovered %s=%s after=%.1fs",
                self.kind,
                self.kind,
                self._subject,
                time.monotonic() - self.failing_since,
            )
            self.failing_since = None
            if self._on_recovered is not None:
                self._on_recovered()


class NodeWatch(ObjectWatch[kube.NodeMeta]):
    """The own Node's labels and annotations, to `on_node` (None: the Node is gone)."""

    def __init__(
        self, api_client: Any, node_name: str, on_node: Callable[[kube.NodeMeta | None], None], **options: Any
    ) -> None:
        super().__init__(
            api_client,
            "/api/v1/nodes",
            node_name,
            kube.NodeMeta.of,
            lambda node, _listed: on_node(node),
            kind="node",
            subject=node_name,
            consequence="the config is not following the node label until it recovers",
            **options,
        )


class ConfigMapWatch(ObjectWatch[ConfigMapData]):
    """The ConfigMap `namespace/name`'s entries, to `on_configmap(data, listed)` (None: there is no
    such ConfigMap)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        on_configmap: Callable[[ConfigMapData | None, bool], None],
        **options: Any,
    ) -> None:
        super().__init__(
            api_client,
            configmaps_path(namespace),
            name,
            ConfigMapData.of,
            on_configmap,
            kind="configmap",
            subject=f"{namespace}/{name}",
            consequence="ConfigMap edits reach this node only through its mounted copy until it recovers",
            **options,
        )
