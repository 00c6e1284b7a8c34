"""Hand-written fakes of nvdp's seams, defined once and imported where used: plugin servers and the
supervisor's registration state, the kubelet's Register, node facts, node health (as the supervisor
and as the Node condition's reporter see it), health targets, Node event sinks and clients,
endpoints, an NVML that cannot start. (A fake of a seam only one test module drives stays in that
module.) Waiting on a condition is `testkit.wait_until`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from nvdp.base.errors import RegistrationError, nvml_error
from nvdp.base.http_endpoint import Pages
from nvdp.kube import Involved
from nvdp.node.gpus.devices import Device, DeviceSet
from nvdp.node.gpus.resources import Resource
from nvdp.node.health.types import HealthChange, HealthSettings, HealthTarget, MonitorStatus
from nvdp.node.nvml.types import GpuInfo
from nvdp.plugins.deviceplugin.responses import ResponseOptions
from nvdp.plugins.deviceplugin.server import PreferredAllocator
from tests.builders import resource

CONTROL_DEVICES = ("/dev/nvidiactl",)  # what FakeFacts finds on the node


class FakeServer:
    """One resource's plugin server as the supervisor drives it (`PluginServer`) and as the kubelet
    link and the probes read it: records start and stop, listens on nothing. `wiped` stands for its
    socket file gone (a kubelet restart)."""

    def __init__(
        self,
        resource: Resource,
        socket_path: Path,
        options: ResponseOptions | None = None,
        allocator: PreferredAllocator | None = None,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = options or ResponseOptions()
        self.allocator = allocator
        self.started = False
        self.stopped = False
        self.wiped = False
        self.kubelet_stream_lost: Callable[[], None] | None = None  # handed in with each registration

    @property
    def resource_name(self) -> str:
        return self.resource.name

    @property
    def devices(self) -> DeviceSet:
        return self.resource.devices

    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        pass

    def start(self) -> None:
        self.started = True

    def stop(self, grace: float = 0.5) -> None:
        self.stopped = True

    def socket_is_ours(self) -> bool:
        return self.started and not self.stopped and not self.wiped

    def abandon(self) -> None:
        self.wiped = True

    def update_resource(self, resource: Resource, allocator: PreferredAllocator | None) -> None:
        self.resource, self.allocator = resource, allocator

    def expect_kubelet_stream(self, lost: Callable[[], None]) -> None:
        self.kubelet_stream_lost = lost


class FakeSupervisor:
    """The supervisor's servers and their registrations as metrics and the probes read them
    (`RegistrationState`); `registered` may change under the reader. Without `servers`, one started
    FakeServer per resource on /dp/<name>.sock."""

    def __init__(
        self,
        registered: Mapping[str, bool],
        servers: Mapping[str, FakeServer] | None = None,
        *,
        started: bool = True,
    ) -> None:
        if servers is None:
            servers = {name: _serving(name) for name in registered}
        self.servers = dict(servers)
        self.registered = dict(registered)
        self.started = started  # whether the supervisor has decided what to serve

    def registrations(self) -> dict[str, bool]:
        return dict(self.registered)


def _serving(name: str) -> FakeServer:
    server = FakeServer(resource(name), Path(f"/dp/{name}.sock"))
    server.start()
    return server


class FakeKubelet:
    """The kubelet as the supervisor sees it: its socket's identity (None while gone) and a Register
    that refuses the next `refuse` calls; records every call."""

    def __init__(self) -> None:
        self.socket_id: tuple[int, int] | None = (1, 1)
        self.refuse = 0  # refuse this many Register calls
        self.calls: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()

    def register(
        self,
        kubelet_socket: Path,
        resource_name: str,
        endpoint: str,
        *,
        preferred_allocation: bool = True,
        timeout: float = 10.0,
    ) -> tuple[int, int]:
        with self._lock:
            if self.refuse:
                self.refuse -= 1
                raise RegistrationError(f"registering {resource_name} failed: UNAVAILABLE")
            assert self.socket_id is not None
            self.calls.append((resource_name, endpoint, preferred_allocation))
            return self.socket_id

    def registered(self) -> list[str]:
        with self._lock:
            return [name for name, _, _ in self.calls]


class FakeFacts:
    """The node's filesystem (`NodeFacts`): CONTROL_DEVICES, no mig-minors file; counts the asking."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.minors_asked = 0

    def control_devices(self, dev_root: str, container_driver_root: str) -> tuple[str, ...]:
        self.asked.append((dev_root, container_driver_root))
        return CONTROL_DEVICES

    def mig_minors(self) -> Mapping[str, int] | None:
        self.minors_asked += 1
        return None


class FakeHealth:
    """The node's health (`NodeHealth`) as the supervisor starts it (records start, targets, stop) and
    as metrics and /readyz read it: checks `enabled`, a monitor `running` (None: none created yet), or
    the monitor `status` given."""

    def __init__(
        self, enabled: bool = True, running: bool | None = True, *, status: MonitorStatus | None = None
    ) -> None:
        self.checks_enabled = enabled
        if status is None and running is not None:
            status = MonitorStatus(running=running, degraded=False, reason=None, last_error=None, rearms=0)
        self.status = status
        self.started: list[tuple[int, HealthSettings | None]] = []
        self.targets: list[list[HealthTarget]] = []
        self.stopped = False

    def start(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None) -> None:
        self.started.append((len(gpus), settings))

    def set_targets(self, targets: Sequence[HealthTarget]) -> None:
        self.targets.append(list(targets))

    def stop(self) -> None:
        self.stopped = True

    def monitor_status(self) -> MonitorStatus | None:
        return self.status

    def unhealthy(self) -> dict[str, HealthChange]:
        return {}


class FakeNodeHealthView:
    """The node's health as the Node condition's reporter reads it (`NodeHealthView`): set `faults`,
    `failing` (the monitor's), `settings` and `gpus` from the test thread."""

    def __init__(self, gpus: Sequence[GpuInfo], settings: HealthSettings | None = None) -> None:
        self.gpus = list(gpus)
        self.settings = settings or HealthSettings()
        self.started = True
        self.failing: str | None = None
        self.current: dict[str, HealthChange] = {}

    def faults(self) -> dict[str, HealthChange]:
        return dict(self.current)

    def monitor_status(self) -> MonitorStatus | None:
        return MonitorStatus(True, self.failing is not None, None, None, 0, failing=self.failing)


class FakeTarget:
    """A health target (what a plugin server is to the health router): records set_health calls."""

    def __init__(self, resource: str, devices: Iterable[Device]) -> None:
        self.resource_name = resource
        self.devices = DeviceSet(devices)
        self.calls: list[tuple[list[str], bool]] = []

    def set_health(self, device_ids: Collection[str], healthy: bool) -> None:
        self.calls.append((sorted(device_ids), healthy))


class FakeEventSink:
    """Where health transitions and misfits go as Node events (`NodeEventSink`, `EventSink`)."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, event_type: str, reason: str, message: str) -> None:
        self.recorded.append((event_type, reason, message))

    def close(self, timeout: float = 1.0) -> None:
        pass


class FakeNodeEventClient:
    """The Node events client at its boundary (`NodeEvents`): what would be posted to the API."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def create_event(self, about: Involved, event_type: str, reason: str, message: str) -> None:
        self.posted.append((event_type, reason, message))


class FakePluginEndpoint:
    """A plugin endpoint as the kubelet stand-in's state needs it: its resource, and watch()."""

    def __init__(self, resource: str, name: str) -> None:
        self.resource = resource
        self.name = name
        self.watching = False

    def watch(self) -> None:
        self.watching = True


class FakeHttpEndpoint:
    """Where the metrics pages would be served (`Endpoint`): records start and stop; port 4242 while
    started."""

    def __init__(self, address: str, pages: Pages) -> None:
        self.address, self.pages = address, pages
        self.calls: list[str] = []

    @property
    def port(self) -> int:
        return 4242 if self.calls[-1:] == ["start"] else 0

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


class BrokenNvml:
    """NVML that cannot initialize (no driver on this node): init() raises `code`."""

    def __init__(self, code: str = "NVML_ERROR_DRIVER_NOT_LOADED") -> None:
        self.code = code

    def init(self) -> None:
        raise nvml_error(self.code, "nvmlInit_v2")
