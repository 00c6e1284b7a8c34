"""The supervisor's registrations with the kubelet: which servers the running kubelet knows.

Registering the servers not registered with this kubelet socket yet (retried with backoff) and
forgetting every registration when the kubelet's socket goes (a kubelet restart) is this module's
one job; the supervisor's loop decides when (`nvdp.plugin.supervisor`). The Register call itself is
the `Registrar` seam (`nvdp.plugin.registration.register` in the daemon), so this is unit-tested
with a hand-written fake.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from nvdp.errors import RegistrationError
from nvdp.logs import log_event
from nvdp.plugin.server import PreferredAllocator
from nvdp.plugin.types import Registrar
from nvdp.plugin.watch import FileId

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 2.0
RETRY_MIN_S = 0.05
RETRY_MAX_S = 5.0


class Registrable(Protocol):
    """What registering a server needs of it (a `nvdp.plugin.types.PluginServer` is one)."""

    @property
    def socket_path(self) -> Path: ...
    @property
    def allocator(self) -> PreferredAllocator | None: ...


class RegistrationObserver(Protocol):
    """What the link reports (a `nvdp.plugin.types.StatusObserver` is one)."""

    def registered(self, resource: str, first: bool) -> None: ...
    def kubelet_lost(self) -> None: ...


class KubeletLink:
    """Resource -> the kubelet socket (identity) it is registered with, None while it is not.

    `ready` is set once every expected resource is registered (also with none to register), and
    cleared when a registered kubelet goes away.
    """

    def __init__(
        self,
        kubelet_socket: Path,
        register: Registrar,
        *,
        ready: threading.Event,
        observer: RegistrationObserver | None = None,
    ) -> None:
        self.kubelet_socket = kubelet_socket
        self._register = register
        self._ready = ready
        self._observer = observer
        self._registered_at: dict[str, FileId | None] = {}
        self._ever_registered: set[str] = set()

    def expect(self, name: str) -> None:
        """A (new) server serves `name`: register it with the kubelet on the next pass."""
        self._registered_at[name] = None

    def forget(self, name: str) -> None:
        """The server of `name` stopped: nothing to register for it any more."""
        self._registered_at.pop(name, None)

    def kubelet_gone(self) -> None:
        """The kubelet's socket is missing: forget every registration and wait for it."""
        if any(v is not None for v in self._registered_at.values()):
            log_event(
                log,
                logging.WARNING,
                "kubelet socket gone; waiting for the kubelet",
                path=str(self.kubelet_socket),
            )
            if self._observer is not None:
                self._observer.kubelet_lost()
            self._ready.clear()
        for name in self._registered_at:
            self._registered_at[name] = None
        if not self._registered_at:
            self._ready.set()

    def register_pending(
        self, servers: Mapping[str, Registrable], kubelet_id: FileId, previous_retry: float | None
    ) -> float | None:
        """Register every server of `servers` not registered with this kubelet socket yet.

        Returns the delay before the next retry, or None when everything is registered.
        """
        failed = False
        for name, server in servers.items():
            if self._registered_at.get(name) == kubelet_id:
                continue
            started = time.monotonic()
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
            self._registered_at[name] = accepted_id
            log_event(
                log,
                logging.INFO,
                "registered with kubelet" if first else "re-registered with kubelet",
                resource=name,
                endpoint=server.socket_path.name,
                ms=round((time.monotonic() - started) * 1000, 1),
            )
            if self._observer is not None:
                self._observer.registered(name, first)
        if failed:
            return min(RETRY_MAX_S, max(RETRY_MIN_S, (previous_retry or RETRY_MIN_S) * 2))
        # Ready also with nothing to serve (no GPUs, or NVML failed with fail-on-init-error=false):
        # a DaemonSet rollout must not stall on such a node; the logs and metrics say why. Not
        # while a server left out of `servers` (it cannot listen yet) is still to be registered.
        if self._registered_at.keys() <= servers.keys():
            self._ready.set()
        return None

    def registrations(self) -> dict[str, bool]:
        """Resource -> registered with the running kubelet, for every resource served. A snapshot
        that any thread may take (the list() is one step under the GIL)."""
        return {name: at is not None for name, at in list(self._registered_at.items())}
