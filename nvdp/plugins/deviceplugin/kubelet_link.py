"""The supervisor's registrations with the kubelet: which servers the running kubelet knows.

- It registers servers not yet registered with this kubelet socket (retried with backoff).
- It forgets all registrations when the kubelet's socket goes (a restart), and one when the
  kubelet's ListAndWatch stream of it ends (the kubelet dropped the resource).
- Without a kubelet socket (empty --kubelet-socket: serve without registering) a listening server
  counts as done.
- The supervisor decides when (`nvdp.plugins.deviceplugin.supervisor`); the call is the `Registrar` seam
  (`nvdp.plugins.kubeletplugin.registration.register`), so it is unit-tested with a fake.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nvdp.base.backoff import Backoff
from nvdp.base.dir_watch import FileId
from nvdp.base.errors import RegistrationError
from nvdp.base.logs import log_event
from nvdp.plugins.deviceplugin.server import PreferredAllocator
from nvdp.plugins.deviceplugin.types import Registrar

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 2.0
RETRY_MIN_S = 0.05
RETRY_MAX_S = 5.0
# After the kubelet's stream of a resource ended: register again this much later (the kubelet finishes
# dropping the old connection first), doubling up to RETRY_MAX_S while streams keep ending within
# STREAM_STABLE_S of their registration.
STREAM_LOST_DELAY_S = 0.5
STREAM_STABLE_S = 30.0


class Registrable(Protocol):
    """What registering a server needs of it (a `nvdp.plugins.deviceplugin.types.PluginServer` is one)."""

    @property
    def socket_path(self) -> Path: ...
    @property
    def allocator(self) -> PreferredAllocator | None: ...
    def expect_kubelet_stream(self, lost: Callable[[], None]) -> None: ...


class RegistrationObserver(Protocol):
    """What the link reports (a `nvdp.plugins.deviceplugin.types.StatusObserver` is one)."""

    def registered(self, resource: str, first: bool) -> None: ...
    def kubelet_lost(self) -> None: ...


@dataclass
class _Registration:
    """One served resource's registration (touched by the supervisor's thread only)."""

    kubelet: FileId | None = None  # the kubelet socket it is registered with; None while it is not
    attempt: int = 0  # the latest Register call's number; a stream-end report names the one it follows
    since: float = 0.0  # the clock's time of the latest registration
    not_before: float = 0.0  # after a lost stream: no Register to the same kubelet before this
    lost_from: FileId | None = None  # the kubelet whose stream ended
    losses: Backoff = field(default_factory=lambda: Backoff(STREAM_LOST_DELAY_S, RETRY_MAX_S))
    serving_unregistered: bool = False  # no kubelet socket: serving is all there is to do


class KubeletLink:
    """Resource -> its registration with the running kubelet.

    `ready` is set once every expected resource is registered (also with none to register; without a
    kubelet socket, once every one listens), and cleared when a registered kubelet goes away or drops
    a resource. `wake` wakes the supervisor's
    loop (a stream-end report comes on a gRPC thread); `clock` is time.monotonic but in tests.
    """

    def __init__(
        self,
        kubelet_socket: Path,
        register: Registrar,
        *,
        ready: threading.Event,
        observer: RegistrationObserver | None = None,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kubelet_socket = kubelet_socket
        self._register = register
        self._ready = ready
        self._observer = observer
        self._wake = wake
        self._clock = clock
        self._registrations: dict[str, _Registration] = {}
        self._ever_registered: set[str] = set()
        self._attempts = itertools.count(1)
        self._lock = threading.Lock()
        self._lost: dict[str, int] = {}  # resource -> attempt whose kubelet stream ended (any thread)

    def expect(self, name: str) -> None:
        """A (new) server serves `name`: register it with the kubelet on the next pass."""
        self._registrations[name] = _Registration()

    def forget(self, name: str) -> None:
        """The server of `name` stopped: nothing to register for it any more."""
        self._registrations.pop(name, None)

    def kubelet_gone(self) -> None:
        """The kubelet's socket is missing: forget every registration and wait for it."""
        if any(r.kubelet is not None for r in self._registrations.values()):
            log_event(
                log,
                logging.WARNING,
                "kubelet socket gone; waiting for the kubelet",
                path=str(self.kubelet_socket),
            )
            if self._observer is not None:
                self._observer.kubelet_lost()
            self._ready.clear()
        for name in self._registrations:
            self._registrations[name] = _Registration()
        if not self._registrations:
            self._ready.set()

    def serve_unregistered(self, servers: Mapping[str, Registrable]) -> None:
        """No kubelet socket: the servers in `servers` (those listening) need no registration; ready
        once every expected resource is among them."""
        for name, server in servers.items():
            r = self._registrations.setdefault(name, _Registration())
            if not r.serving_unregistered:
                r.serving_unregistered = True
                log_event(
                    log,
                    logging.INFO,
                    "serving without registering (--kubelet-socket / KUBELET_SOCKET is empty)",
                    resource=name,
                    socket=str(server.socket_path),
                )
        if self._registrations.keys() <= servers.keys():
            self._ready.set()

    def _stream_ended(self, name: str, attempt: int) -> None:
        """The kubelet's stream of `name` after Register call `attempt` ended (a gRPC thread)."""
        with self._lock:
            self._lost[name] = attempt
        self._wake()

    def _take_lost(self, now: float) -> None:
        """Forget the registrations whose kubelet stream ended, and say when to register again."""
        with self._lock:
            lost, self._lost = self._lost, {}
        for name, attempt in lost.items():
            r = self._registrations.get(name)
            if r is None or r.kubelet is None or r.attempt != attempt:
                continue  # an earlier registration's stream, or the kubelet is gone anyway
            if now - r.since >= STREAM_STABLE_S:
                r.losses.reset()
            delay = r.losses.next()
            r.lost_from, r.kubelet, r.not_before = r.kubelet, None, now + delay
            log_event(
                log,
                logging.WARNING,
                "kubelet dropped the resource (its ListAndWatch stream ended); registering again",
                resource=name,
                in_s=delay,
            )
            self._ready.clear()

    def register_pending(
        self, servers: Mapping[str, Registrable], kubelet_id: FileId, previous_retry: float | None
    ) -> float | None:
        """Register every server of `servers` not registered with this kubelet socket yet.

        Returns the delay before the next pass, or None when everything is registered.
        """
        now = self._clock()
        self._take_lost(now)
        failed = False
        waiting: float | None = None  # the soonest re-registration held back after a lost stream
        for name, server in servers.items():
            r = self._registrations.setdefault(name, _Registration())
            if r.kubelet == kubelet_id:
                continue
            if r.lost_from == kubelet_id and now < r.not_before:
                waiting = min(waiting or RETRY_MAX_S, r.not_before - now)
                continue
            started = self._clock()
            r.attempt = next(self._attempts)
            server.expect_kubelet_stream(functools.partial(self._stream_ended, name, r.attempt))
            try:
                accepted_id = self._register(
                    self.kubelet_socket,
                    name,
                    server.socket_path.name,
                    preferred_allocation=server.allocator is not None,
                    timeout=REGISTER_TIMEOUT_S,
                )
            except RegistrationError as error:
                log_event(
                    log, logging.WARNING, "registration failed; will retry", resource=name, error=str(error)
                )
                failed = True
                continue
            first = name not in self._ever_registered
            self._ever_registered.add(name)
            r.kubelet, r.since = accepted_id, self._clock()
            log_event(
                log,
                logging.INFO,
                "registered with kubelet" if first else "re-registered with kubelet",
                resource=name,
                endpoint=server.socket_path.name,
                ms=round((r.since - started) * 1000, 1),
            )
            if self._observer is not None:
                self._observer.registered(name, first)
        if failed:
            retry = min(RETRY_MAX_S, max(RETRY_MIN_S, (previous_retry or RETRY_MIN_S) * 2))
            return retry if waiting is None else min(retry, waiting)
        if waiting is not None:
            return waiting
        # Ready also with nothing to serve (no GPUs, or NVML failed with fail-on-init-error=false):
        # a DaemonSet rollout must not stall on such a node; the logs and metrics say why. Not
        # while a server left out of `servers` (it cannot listen yet) is still to be registered.
        if self._registrations.keys() <= servers.keys():
            self._ready.set()
        return None

    def registrations(self) -> dict[str, bool]:
        """Resource -> registered with the running kubelet, for every resource served. A snapshot
        that any thread may take (the list() is one step under the GIL); a resource whose kubelet
        stream just ended reads False at once. Without a kubelet socket: True once it listens."""
        with self._lock:
            lost = dict(self._lost)
        return {
            name: r.serving_unregistered or (r.kubelet is not None and lost.get(name) != r.attempt)
            for name, r in list(self._registrations.items())
        }
