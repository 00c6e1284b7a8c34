"""Admitting a pod as the kubelet's device manager does: for each container and each resource it
asks for, the free Healthy devices are offered to GetPreferredAllocation (when the plugin offers it),
its choice (filled up from the free ones, as the kubelet does when a preference falls short) goes to
Allocate, and the assignment is recorded (`nvdp.sim.kubelet.pod_resources.AdmittedPods`), where
the PodResources API and the device checkpoint show it. A pod that cannot get all its devices is
refused and holds none.
"""

from __future__ import annotations

import uuid as uuids
from collections.abc import Mapping, Sequence
from typing import Protocol

from nvdp.api import HEALTHY, pb
from nvdp.base.errors import KubeletError
from nvdp.sim.kubelet.pod_resources import AdmittedPod, AdmittedPods, Assignment
from nvdp.sim.kubelet.state import DeviceState

ContainerRequests = Mapping[str, Mapping[str, int]]  # container -> resource -> how many devices


class DevicePlugins(Protocol):
    """What admission asks of the kubelet stand-in (`nvdp.sim.kubelet.Kubelet`)."""

    def devices(self, resource: str) -> dict[str, DeviceState]: ...
    def options(self, resource: str) -> pb.DevicePluginOptions: ...
    def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...
    def allocate(self, resource: str, containers: Sequence[Sequence[str]]) -> pb.AllocateResponse: ...


def admit(
    plugins: DevicePlugins,
    pods: AdmittedPods,
    namespace: str,
    name: str,
    containers: ContainerRequests,
    uid: str | None = None,
) -> AdmittedPod:
    """Give each container of the pod the devices it asks for and record them. Raises KubeletError
    when a resource has too few free Healthy devices; grpc.RpcError when the plugin refuses."""
    taken: dict[str, set[str]] = {}  # this pod's devices so far, by resource
    assignments = []
    for container, requests in containers.items():
        for resource, count in requests.items():
            held = pods.held(resource) | taken.setdefault(resource, set())
            free = [i for i, s in plugins.devices(resource).items() if s.health == HEALTHY and i not in held]
            if count < 1 or len(free) < count:
                raise KubeletError(
                    f"pod {namespace}/{name} refused: container {container} asks for {count} {resource}, "
                    f"{len(free)} free"
                )
            chosen = _choose(plugins, resource, free, count)
            answer = plugins.allocate(resource, [chosen])
            taken[resource].update(chosen)
            assignments.append(Assignment(container, resource, tuple(chosen), answer.container_responses[0]))
    pod = AdmittedPod(namespace, name, uid or str(uuids.uuid4()), tuple(assignments))
    pods.add(pod)
    return pod


def _choose(plugins: DevicePlugins, resource: str, free: list[str], count: int) -> list[str]:
    """The plugin's preference among the free devices (when it has one), filled up to `count`."""
    chosen: list[str] = []
    if plugins.options(resource).get_preferred_allocation_available:
        preferred = plugins.preferred_allocation(resource, free, [], count)
        chosen = [i for i in dict.fromkeys(preferred) if i in free][:count]
    return chosen + [i for i in free if i not in chosen][: count - len(chosen)]
