"""Liveness and readiness (/healthz, /readyz): read from the supervisor's registration state and the
node's health at probe time; nothing here keeps a copy of either.

Ready means: every resource is registered with the running kubelet, every plugin server answers an
RPC over its socket (`rpc_probe`, checked at most every RPC_PROBE_CACHE_S per socket), no resource the
config asks for is left without devices by a node fact (`nvdp.node.gpus.misfits`: missing device nodes, an MPS
daemon not up, ...), and the health monitor runs and has not been degraded beyond
`health.degradedGracePeriod`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from nvdp.plugins.metrics.sources import HealthView, MisfitView, RegistrationState

SOCKET_GRACE_S = 30.0  # a plugin socket may be missing this long while the supervisor restarts it
RPC_PROBE_CACHE_S = 5.0  # a socket's RPC probe outcome is reused this long

RpcProbe = Callable[[Path], str | None]  # socket -> None when its server answers, else why not
RegistrationProblems = Callable[[], Mapping[str, str]]  # resource -> why it cannot be registered now


class Probes:
    """Answers the probes from the daemon's sources, read at probe time: the supervisor's registration
    state (None: no supervisor, always starting), the node's health and misfits, the RPC probe of the
    sockets, the supervisor's `registration_problems` and `restart_needed` (each None: not checked).
    Until the supervisor has decided what to serve (`started`), the daemon is starting."""

    def __init__(
        self,
        registrations: RegistrationState | None = None,
        health: HealthView | None = None,
        misfits: MisfitView | None = None,
        *,
        rpc_probe: RpcProbe | None = None,
        registration_problems: RegistrationProblems | None = None,
        restart_needed: Callable[[], str | None] | None = None,  # why only a restart helps
    ) -> None:
        self.registrations, self.health, self.misfits = registrations, health, misfits
        self._rpc_probe, self._restart_needed = rpc_probe, restart_needed
        self._registration_problems = registration_problems
        self._lock = threading.Lock()
        self._probed: dict[Path, tuple[float, str | None]] = {}  # socket -> (when, outcome)
        self._missing_since: dict[int, float] = {}  # id(server) -> when its socket was seen missing

    def liveness_problem(self) -> str | None:
        """None when every server serves on its socket or is being restarted (socket wiped by a kubelet
        restart less than SOCKET_GRACE_S ago, or the kubelet is away); else why not. Also not live
        while the kubelet directory is a stale mount (removed on the host): a restart mounts the new one."""
        source = self.registrations
        if source is None:
            return None
        restart = self._restart_needed() if self._restart_needed is not None else None
        if restart is not None:
            return f"kubelet directory unusable: {restart}"
        servers = dict(source.servers)
        registered = source.registrations()
        now = time.monotonic()
        stuck = []
        with self._lock:
            missing: dict[int, float] = {}
            for name, server in servers.items():
                if registered.get(name) and not server.socket_is_ours():
                    since = missing[id(server)] = self._missing_since.get(id(server), now)
                    if now - since >= SOCKET_GRACE_S:
                        stuck.append(str(server.socket_path))
            self._missing_since = missing
        if not stuck:
            return None
        return f"plugin socket missing for over {SOCKET_GRACE_S:.0f}s: {', '.join(sorted(stuck))}"

    def _not_answering(self, source: RegistrationState) -> list[str]:
        """`resource (why)` for every server whose socket does not answer the RPC probe."""
        probe = self._rpc_probe
        if probe is None:
            return []
        now = time.monotonic()
        problems = []
        for name, server in sorted(dict(source.servers).items()):
            path = server.socket_path
            with self._lock:
                cached = self._probed.get(path)
            if cached is None or now - cached[0] >= RPC_PROBE_CACHE_S:
                cached = (now, probe(path))
                with self._lock:
                    self._probed[path] = cached
            if cached[1] is not None:
                problems.append(f"{name} ({cached[1]})")
        return problems

    def readiness_problem(self) -> str | None:
        """None when every resource is registered with the running kubelet and the health monitor runs
        (or when there is nothing to serve: no devices, or NVML failed with fail-on-init-error=false)."""
        source = self.registrations
        if source is None or not source.started:
            return "starting: no resources served yet"
        registered = source.registrations()
        missing = sorted(name for name, ok in registered.items() if not ok)
        if missing:
            why = self._registration_problems() if self._registration_problems is not None else {}
            return "not registered: " + ", ".join(f"{n} ({why[n]})" if n in why else n for n in missing)
        silent = self._not_answering(source)
        if silent:
            return f"not answering: {', '.join(silent)}"
        withheld = self.misfits.withheld() if self.misfits is not None else {}
        if withheld:
            reasons = "; ".join(f"{resource} ({why})" for resource, why in sorted(withheld.items()))
            return f"withheld by a node fact: {reasons}"
        health = self.health
        if registered and health is not None:  # no devices, nothing to watch
            return monitor_problem(health)
        return None


def monitor_problem(health: HealthView) -> str | None:
    """Why the health monitor keeps a daemon from being ready (the device plugin's, the DRA plugin's):
    not running, or degraded beyond `health.degradedGracePeriod`; None with health checks off."""
    if not health.checks_enabled:
        return None
    status = health.monitor_status()
    if status is None or not status.running:
        return "health monitor not running"
    return status.failing  # devices stay as they are; the node's problem shows
