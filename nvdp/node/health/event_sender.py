"""Kubernetes Events sent off the path of what reports them: the Node's (`node_events`) and the pods'
(`pod_events`) alike.

`send()` only puts the event on a bounded queue (dropping it, with a warning, when the queue is full);
one worker thread creates the client lazily and posts the events. A slow or failing API server
therefore never delays health handling. The client is anything with `EventClient`'s one method;
`writer_from_env` wires in `nvdp.kube.KubeEvents`: the `kubernetes` client is built (and ssl let
in) only when the first event is sent.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from nvdp import kube
from nvdp.base.logs import log_event
from nvdp.kube import Involved


class EventClient(Protocol):
    def create_event(self, about: Involved, event_type: str, reason: str, message: str) -> None:
        """Create one Event on `about`. Raises on failure."""
        ...


@dataclass(frozen=True)
class Event:
    about: Involved
    event_type: str
    reason: str
    message: str


class EventSender:
    """Bounded queue + one worker thread posting `kind` events ("node", "pod": the thread's name and
    the warnings') with `client_factory()`'s client; warnings go to `log`. `sent`, `failed` and
    `dropped` count what became of each event."""

    def __init__(
        self, client_factory: Callable[[], EventClient], *, kind: str, max_queue: int, log: logging.Logger
    ) -> None:
        self._factory = client_factory
        self._client: EventClient | None = None
        self._kind = kind
        self._log = log
        self._queue: queue.Queue[Event | None] = queue.Queue(max_queue)
        self._closed = False
        self._abandoned = False
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"nvdp-{kind}-events", daemon=True)
        self._thread.start()

    def send(self, event: Event) -> None:
        """Queue one event; never blocks."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            self._warn("dropped: queue full", event)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued within `timeout`, then stop (what is left is dropped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._abandoned = True  # a worker stuck on a slow API server quits after that request

    def join(self, timeout: float) -> bool:
        """Wait until every queued event was handled (for tests and shutdown); True when done."""
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None or self._abandoned:
                    return
                self._send(event)
            finally:
                self._queue.task_done()

    def _send(self, event: Event) -> None:
        try:
            if self._client is None:
                self._client = self._factory()
            self._client.create_event(event.about, event.event_type, event.reason, event.message)
        except Exception as error:  # the API server's problems are never ours to raise
            with self._lock:
                self.failed += 1
            self._warn(
                "not recorded", event, error=" ".join(str(error).split())[:300] or type(error).__name__
            )
        else:
            with self._lock:
                self.sent += 1

    def _warn(self, what: str, event: Event, **fields: object) -> None:
        """A namespaced object is named (`pod=ns/name`); the Node is this node."""
        about = event.about
        where = {about.kind.lower(): f"{about.namespace}/{about.name}"} if about.namespace else {}
        log_event(
            self._log, logging.WARNING, f"{self._kind} event {what}", **where, reason=event.reason, **fields
        )


def writer_from_env(
    environ: Mapping[str, str],
    *,
    node: str | None,
    kubeconfig: str,
    component: str,
    token_file: str,
) -> tuple[str, Callable[[], EventClient]] | None:
    """This node's name (`node`, else NODE_NAME) and how to build its Event writer when the API server
    is reachable: through `kubeconfig` when given, else with in-cluster credentials; None otherwise
    (events off)."""
    name = environ.get("NODE_NAME", "") if node is None else node
    if not name:
        return None
    if kubeconfig:
        return name, lambda: kube.KubeEvents(
            name, api_client=kube.new_api_client(kubeconfig=kubeconfig), component=component
        )
    if not kube.in_cluster(environ, token_file):
        return None
    return name, lambda: kube.KubeEvents(name, component=component)
