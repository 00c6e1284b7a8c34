"""Kubernetes Node events (health transitions, misfits), off the path of what reports them.

`record()` only puts the event on a bounded queue (dropping it, with a warning, when the queue is
full); a worker thread creates the client lazily and posts the events. A slow or failing API server
therefore never delays health handling. The client is anything with `NodeEventClient`'s one
method; `node_events_from_env` wires in `nvdp.kube.KubeNodeEvents` for the plugin and gfd.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from nvdp import kube
from nvdp.logs import log_event

log = logging.getLogger(__name__)


class NodeEventClient(Protocol):
    def create_node_event(self, event_type: str, reason: str, message: str) -> None:
        """Create one Event on this node's Node object. Raises on failure."""
        ...


_Item = tuple[str, str, str]


class NodeEventRecorder:
    """Bounded queue + one worker thread posting Node events with `client_factory()`'s client."""

    def __init__(self, client_factory: Callable[[], NodeEventClient], *, max_queue: int = 64) -> None:
        self._factory = client_factory
        self._client: NodeEventClient | None = None
        self._queue: queue.Queue[_Item | None] = queue.Queue(max_queue)
        self._closed = False
        self._abandoned = False
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="nvdp-node-events", daemon=True)
        self._thread.start()

    def record(self, event_type: str, reason: str, message: str) -> None:
        """Queue one event; never blocks."""
        if self._closed:
            return
        try:
            self._queue.put_nowait((event_type, reason, message))
        except queue.Full:
            with self._lock:
                self.dropped += 1
            log_event(log, logging.WARNING, "node event dropped: queue full", reason=reason)

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
            item = self._queue.get()
            try:
                if item is None or self._abandoned:
                    return
                self._send(*item)
            finally:
                self._queue.task_done()

    def _send(self, event_type: str, reason: str, message: str) -> None:
        try:
            if self._client is None:
                self._client = self._factory()
            self._client.create_node_event(event_type, reason, message)
        except Exception as e:  # the API server's problems are never ours to raise
            with self._lock:
                self.failed += 1
            log_event(log, logging.WARNING, "node event not recorded", reason=reason, error=_one_line(e))
        else:
            with self._lock:
                self.sent += 1


def node_events_from_env(
    environ: Mapping[str, str],
    *,
    node: str | None = None,
    kubeconfig: str = "",
    component: str = kube.EVENT_SOURCE,
    token_file: str = kube.SERVICE_ACCOUNT_TOKEN,
    max_queue: int = 64,
) -> NodeEventRecorder | None:
    """A recorder for events on this node (`node`, else NODE_NAME) when the API server is reachable:
    through `kubeconfig` when given, else with in-cluster credentials; None otherwise (feature off).

    The `kubernetes` client is built (and ssl let in) only when the first event is sent."""
    name = environ.get("NODE_NAME", "") if node is None else node
    if not name:
        return None
    if kubeconfig:
        return NodeEventRecorder(
            lambda: kube.KubeNodeEvents(
                name, api_client=kube.new_api_client(kubeconfig=kubeconfig), component=component
            ),
            max_queue=max_queue,
        )
    if not kube.in_cluster(environ, token_file):
        return None
    return NodeEventRecorder(lambda: kube.KubeNodeEvents(name, component=component), max_queue=max_queue)


def _one_line(error: Exception) -> str:
    status, reason = getattr(error, "status", None), getattr(error, "reason", None)
    if status is not None:  # kubernetes ApiException: its str() is the whole response
        return f"{type(error).__name__}: {status} {reason or ''}".rstrip()
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
