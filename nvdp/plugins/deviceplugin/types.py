"""Value types and seams of the supervisor: its settings, and the protocols of the parts it drives
(servers, kubelet registration, host facts, health, observer; its directory watch:
`nvdp.base.dir_watch.Watcher`). The real parts live beside it in nvdp.plugins.deviceplugin and
nvdp.node.health; tests hand in fakes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from nvdp.base.dir_watch import FileId
from nvdp.config.model import DEFAULT_CONTAINER_DRIVER_ROOT
from nvdp.node.cdi.names import CdiSettings
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import Resource
from nvdp.node.health.types import HealthSettings, HealthTarget
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import PreferredAllocator
from nvdp.plugins.deviceplugin.status import RpcObserver


@dataclass(frozen=True)
class DaemonSettings:
    """What the supervisor needs from the resolved configuration (`nvdp.plugins.deviceplugin.daemon_settings`
    maps it).
    `response` holds what the config says of Allocate answers; the node facts in them (control
    devices, CDI names) are added once per apply. The plugin sockets go in `kubelet_socket`'s
    directory; `register_with_kubelet` False (an empty --kubelet-socket) serves them without
    registering, as NVIDIA's plugin does."""

    kubelet_socket: Path
    register_with_kubelet: bool = True
    fail_on_init_error: bool = True
    container_driver_root: str = DEFAULT_CONTAINER_DRIVER_ROOT  # where the chart mounts it in our container
    rules: ResourceRules = field(default_factory=ResourceRules)
    response: ResponseOptions = field(default_factory=ResponseOptions)
    health: HealthSettings | None = None  # passed through to HealthHooks.start
    cdi: CdiSettings | None = None  # CDI specs are written (nvdp.node.cdi) when set

    @property
    def dev_root(self) -> str:
        """The host's root for /dev/nvidia* (device-spec host paths)."""
        return self.response.dev_root


class PluginServer(HealthTarget, Protocol):
    """One resource's gRPC server as the supervisor drives it
    (`nvdp.plugins.deviceplugin.server.DevicePluginServer`)."""

    @property
    def resource(self) -> Resource: ...
    @property
    def socket_path(self) -> Path: ...
    @property
    def options(self) -> ResponseOptions: ...
    @property
    def allocator(self) -> PreferredAllocator | None: ...
    def start(self) -> None:
        """Listen and serve. Raises NvdpError when the socket cannot be made (may be retried)."""
        ...

    def stop(self, grace: float = 0.5) -> None:
        """Idempotent; removes the server's socket when it is still ours."""
        ...

    def socket_is_ours(self) -> bool:
        """False when the socket file was deleted or replaced (a kubelet restart wipes it)."""
        ...

    def abandon(self) -> None:
        """A stop that did not finish: remove the socket file if it is ours (any thread)."""
        ...

    def update_resource(self, resource: Resource, allocator: PreferredAllocator | None) -> None:
        """Serve changed devices of the same resource on the running server (same stream and
        registration); devices that remain keep their health."""
        ...

    def expect_kubelet_stream(self, lost: Callable[[], None]) -> None:
        """A registration is being sent: the next ListAndWatch stream is the kubelet's; `lost` is
        called (on any thread) when it ends while the server serves."""
        ...


S = TypeVar("S", bound=PluginServer)  # the server type a Supervisor runs
S_co = TypeVar("S_co", bound=PluginServer, covariant=True)
S_contra = TypeVar("S_contra", bound=PluginServer, contravariant=True)


class ServerFactory(Protocol[S_co]):
    """Builds (does not start) the server for one resource on `socket_path`."""

    def __call__(
        self,
        resource: Resource,
        socket_path: Path,
        options: ResponseOptions,
        allocator: PreferredAllocator | None,
    ) -> S_co: ...


class Registrar(Protocol):
    """Registers one server with the kubelet (`nvdp.plugins.kubeletplugin.registration.register`); returns
    the identity of the kubelet socket that accepted. Raises RegistrationError."""

    def __call__(
        self,
        kubelet_socket: Path,
        resource_name: str,
        endpoint: str,
        *,
        preferred_allocation: bool = True,
        timeout: float = 10.0,
    ) -> FileId: ...


class HostFacts(Protocol):
    """The host's files as resources and responses need them
    (`nvdp.plugins.deviceplugin.host_facts.RealHostFacts`)."""

    def control_devices(self, dev_root: str, container_driver_root: str) -> tuple[str, ...]: ...
    def mig_minors(self) -> Mapping[str, int] | None: ...


class AllocatorFactory(Protocol):
    def __call__(self, resource: Resource, gpus: Sequence[GpuInfo]) -> PreferredAllocator | None: ...


class HealthHooks(Protocol):
    """The health subsystem as the supervisor sees it (`nvdp.node.health.node.NodeHealth`)."""

    def start(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None) -> None:
        """Start monitoring, or on a reload take the new enumeration and settings."""
        ...

    def set_targets(self, targets: Sequence[HealthTarget]) -> None: ...
    def stop(self) -> None: ...


class MisfitSink(Protocol):
    """Where the node facts that keep part of the config from applying go, per source
    (`nvdp.node.gpus.misfit_report.MisfitReport`)."""

    def update(self, source: str, misfits: Iterable[Misfit]) -> None: ...


class StatusObserver(RpcObserver, Protocol[S_contra]):
    """Receives lifecycle facts and every RPC's outcome (metrics, readiness)."""

    def registered(self, resource: str, first: bool) -> None: ...
    def servers_changed(self, servers: Mapping[str, S_contra]) -> None: ...
    def kubelet_lost(self) -> None: ...
    def reloaded(self, ok: bool) -> None: ...


class DirClaimHooks(Protocol):
    """The kubelet directory claimed for this process (`nvdp.plugins.kubeletplugin.dir_lock.DirClaim`)."""

    def acquire(self, stop: threading.Event) -> bool:
        """Block until the directory is usable and locked (True) or `stop` is set (False)."""
        ...

    def refresh(self) -> float | None:
        """Lock again after a kubelet restart emptied or replaced the directory. None while the
        claim holds, else the delay before the next try."""
        ...

    @property
    def problem(self) -> str | None:
        """Why the claim does not hold now, None while it holds."""
        ...

    @property
    def stale_mount(self) -> bool:
        """The path names a removed directory: only a restart (a new mount) brings it back."""
        ...

    def release(self) -> None: ...
