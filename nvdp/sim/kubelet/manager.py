"""`Kubelet`, the stand-in put together as the kubelet's device manager is: a Registration server on
`kubelet.sock` (`registration`), one endpoint per plugin with its ListAndWatch (`endpoint`), and the
device state they report to through small handler interfaces (`state`).

- It calls GetPreferredAllocation, Allocate and PreStartContainer, and hands out the state's
  observations (registrations, timed device lists, stream ends) for callers to wait on.
- `restart` looks like a kubelet restart: connections drop, every plugin-directory socket but the
  checkpoint goes, `kubelet.sock` comes back (optionally refusing connections for a while).
- `admit_pod` admits as the kubelet does (`nvdp.sim.kubelet.admission`); with `pod_resources`
  the record is served on the PodResources API (`nvdp.sim.kubelet.pod_resources`).
- Admitted pods outlive restarts, as the kubelet's checkpoint keeps them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from nvdp.api import pb
from nvdp.base.errors import KubeletError, PluginNotConnected
from nvdp.sim.kubelet.admission import ContainerRequests, admit
from nvdp.sim.kubelet.endpoint import StreamEnd
from nvdp.sim.kubelet.pod_resources import (
    POD_RESOURCES_DIR,
    AdmittedPod,
    AdmittedPods,
    PodResourcesServer,
)
from nvdp.sim.kubelet.registration import (
    KUBELET_SOCKET,
    Registration,
    RegistrationServer,
    Rejection,
    SocketState,
)
from nvdp.sim.kubelet.state import DeviceManagerState, DeviceState, Update

log = logging.getLogger(__name__)

T = TypeVar("T")


class Kubelet:
    """`with Kubelet(dir) as kubelet:` serves `dir/kubelet.sock` until the block ends.

    Lifecycle calls (start, restart, stop) are serialized; everything else is thread-safe. Observations
    (registrations, updates, stream ends) accumulate across restarts; device lists are what the running
    kubelet knows, so a restart empties them until plugins register again.
    """

    def __init__(
        self,
        plugin_dir: Path | str,
        *,
        dial_timeout: float = 10.0,
        rpc_timeout: float = 10.0,
        workers: int = 4,
        pod_resources: bool = False,
    ) -> None:
        self.plugin_dir = Path(plugin_dir).absolute()
        self.rpc_timeout = rpc_timeout
        self.device_state = DeviceManagerState()
        self.registration = RegistrationServer(
            self.plugin_dir, self.device_state, dial_timeout=dial_timeout, workers=workers
        )
        self.socket_path = self.registration.socket_path
        self.pods = AdmittedPods(self.plugin_dir, self._device_lists)
        self.pod_resources_socket = self.plugin_dir.parent / POD_RESOURCES_DIR / KUBELET_SOCKET
        self._pod_resources = (
            PodResourcesServer(self.pod_resources_socket, self.pods, self._device_lists)
            if pod_resources
            else None
        )
        self._lifecycle = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Clean the plugin directory and serve the Registration service on kubelet.sock."""
        with self._lifecycle:
            if self.state != "stopped":
                raise KubeletError(f"kubelet stand-in already running on {self.socket_path}")
            self._serve(0.0)

    def restart(self, accept_delay: float = 0.0) -> None:
        """Restart like a real kubelet: drop every plugin, remove the sockets, re-create kubelet.sock.

        With `accept_delay`, kubelet.sock exists but refuses connections (ECONNREFUSED) for that many
        seconds before it serves; the call returns once it serves.
        """
        with self._lifecycle:
            log.info("kubelet restarting dir=%s accept_delay=%s", self.plugin_dir, accept_delay)
            self._shutdown()
            self._serve(accept_delay)

    def stop(self) -> None:
        """Stop serving and close every plugin connection; idempotent."""
        with self._lifecycle:
            self._shutdown()

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def state(self) -> SocketState:
        return self.device_state.socket_state

    @property
    def serving_since(self) -> float | None:
        """time.monotonic() when kubelet.sock last began accepting."""
        return self.device_state.serving_since

    def _serve(self, accept_delay: float) -> None:
        self.device_state.forget_devices()
        self.registration.serve(accept_delay)
        if self._pod_resources is not None:
            self._pod_resources.serve()

    def _shutdown(self) -> None:
        if self.state == "stopped":
            return
        self.registration.stop()  # no plugin connects after this
        if self._pod_resources is not None:
            self._pod_resources.stop()
        endpoints = self.device_state.disconnect_all()
        for endpoint in endpoints:
            endpoint.close()
        for endpoint in endpoints:
            endpoint.join()
        self.device_state.socket_state_changed("stopped")
        log.info("kubelet stopped socket=%s", self.socket_path)

    # -- observations (kept by `device_state`) -----------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        return self.device_state.registrations

    @property
    def rejections(self) -> list[Rejection]:
        return self.device_state.rejections

    def resources(self) -> list[str]:
        """Resources with a connected plugin."""
        return self.device_state.resources()

    def devices(self, resource: str) -> dict[str, DeviceState]:
        """The latest device list of `resource` ({} before the first update or after a restart)."""
        return self.device_state.devices(resource)

    def node_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """The Node status's capacity and allocatable of the device plugins' resources, as now."""
        return self.device_state.node_counts()

    def updates(self, resource: str) -> list[Update]:
        return self.device_state.updates(resource)

    def stream_ends(self, resource: str) -> list[StreamEnd]:
        return self.device_state.stream_ends(resource)

    def stream_closed(self, resource: str) -> bool:
        """True when no ListAndWatch stream of `resource` is open."""
        return self.device_state.stream_closed(resource)

    def wait_for(
        self, predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "condition"
    ) -> T:
        """Wait until `predicate()` is truthy (it runs with the state locked); return its value."""
        return self.device_state.wait_for(predicate, timeout, what)

    def wait_for_registration(self, resource: str, count: int = 1, timeout: float = 10.0) -> Registration:
        """Wait for the `count`-th registration of `resource` (counting across restarts); return it."""
        return self.device_state.wait_for_registration(resource, count, timeout)

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[dict[str, DeviceState]], bool] = bool,
        timeout: float = 10.0,
    ) -> dict[str, DeviceState]:
        """Wait until the device list of `resource` satisfies `predicate` (default: not empty)."""
        return self.device_state.wait_for_devices(resource, predicate, timeout)

    def wait_for_updates(self, resource: str, count: int, timeout: float = 10.0) -> list[Update]:
        """Wait until `resource` has received at least `count` ListAndWatch responses in all."""
        return self.device_state.wait_for_updates(resource, count, timeout)

    def wait_for_stream_closed(self, resource: str, timeout: float = 10.0) -> None:
        self.device_state.wait_for_stream_closed(resource, timeout)

    def _device_lists(self) -> Mapping[str, dict[str, DeviceState]]:
        return {resource: self.devices(resource) for resource in self.resources()}

    # -- pods (the kubelet's admission; its record served by PodResources) ------------------------

    def admit_pod(
        self, namespace: str, name: str, containers: ContainerRequests, uid: str | None = None
    ) -> AdmittedPod:
        """Admit a pod whose containers ask for devices ({container: {resource: count}}) as the
        kubelet does (GetPreferredAllocation when offered, then Allocate per container and resource)
        and record what each container got. Raises KubeletError when too few devices are free,
        grpc.RpcError when a plugin refuses."""
        return admit(self, self.pods, namespace, name, containers, uid)

    def remove_pod(self, namespace: str, name: str) -> AdmittedPod:
        """The pod ended: its devices are free again (and leave the PodResources answers)."""
        return self.pods.remove(namespace, name)

    # -- calls into plugins (gRPC errors propagate as grpc.RpcError) ------------------------------

    def stub(self, resource: str) -> Any:
        """The DevicePlugin stub of the plugin connected for `resource` (its one channel)."""
        plugin = self.device_state.endpoint(resource)
        if plugin is None:
            raise PluginNotConnected(f"no device plugin connected for resource {resource}")
        return plugin.stub

    def _call(self, resource: str, invoke: Callable[[Any], T]) -> T:
        stub = self.stub(resource)
        try:
            return invoke(stub)
        except ValueError as e:  # grpc: "Cannot invoke RPC on closed channel!"
            raise PluginNotConnected(f"device plugin for resource {resource} disconnected: {e}") from e

    def options(self, resource: str) -> pb.DevicePluginOptions:
        options: pb.DevicePluginOptions = self._call(
            resource, lambda s: s.GetDevicePluginOptions(pb.Empty(), timeout=self.rpc_timeout)
        )
        return options

    def allocate(self, resource: str, containers: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        """Allocate, one container request per entry of `containers`."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers]
        )
        response: pb.AllocateResponse = self._call(
            resource, lambda s: s.Allocate(request, timeout=self.rpc_timeout)
        )
        return response

    def get_preferred_allocation(
        self, resource: str, request: pb.PreferredAllocationRequest
    ) -> pb.PreferredAllocationResponse:
        response: pb.PreferredAllocationResponse = self._call(
            resource, lambda s: s.GetPreferredAllocation(request, timeout=self.rpc_timeout)
        )
        return response

    def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The plugin's preferred `size` devices for one container."""
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = self.get_preferred_allocation(resource, request)
        if len(response.container_responses) != 1:
            raise KubeletError(
                f"GetPreferredAllocation for {resource} answered {len(response.container_responses)} "
                "containers for 1 request"
            )
        return list(response.container_responses[0].deviceIDs)

    def pre_start_container(self, resource: str, ids: Sequence[str]) -> pb.PreStartContainerResponse:
        request = pb.PreStartContainerRequest(devices_ids=list(ids))
        response: pb.PreStartContainerResponse = self._call(
            resource, lambda s: s.PreStartContainer(request, timeout=self.rpc_timeout)
        )
        return response
