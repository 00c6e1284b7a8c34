"""The stand-in's record of the pods admitted through it, served as the kubelet serves it: the
PodResources API (List, Get, GetAllocatableResources) on `<root>/pod-resources/kubelet.sock` (the root
being the parent of the plugin directory), and the device checkpoint `kubelet_internal_checkpoint` in
the plugin directory, in the kubelet's format (pod UID, container, resource, device IDs by NUMA node,
the Allocate answer). Like the kubelet, the API answers with one ContainerDevices per device ID.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from nvdp.api import pb
from nvdp.api.podresources import podresources_grpc, podresources_pb
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import KubeletError
from nvdp.base.files import write_atomic
from nvdp.sim.kubelet.registration import CHECKPOINT_FILE
from nvdp.sim.kubelet.state import DeviceState

log = logging.getLogger(__name__)

POD_RESOURCES_DIR = "pod-resources"
NO_NUMA_NODE = -1  # the kubelet's key for devices without topology


@dataclass(frozen=True)
class Assignment:
    """The devices of one resource given to one container, and the plugin's Allocate answer."""

    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: pb.ContainerAllocateResponse


@dataclass(frozen=True)
class AdmittedPod:
    namespace: str
    name: str
    uid: str
    assignments: tuple[Assignment, ...]


DeviceLists = Callable[[], Mapping[str, Mapping[str, DeviceState]]]  # resource -> its devices


class AdmittedPods:
    """The pods admitted and the devices they hold (the kubelet's podDevices); thread-safe. Every
    change is written to the checkpoint in `plugin_dir`."""

    def __init__(self, plugin_dir: Path, devices: DeviceLists) -> None:
        self._checkpoint = plugin_dir / CHECKPOINT_FILE
        self._devices = devices
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], AdmittedPod] = {}

    def add(self, pod: AdmittedPod) -> None:
        with self._lock:
            if (pod.namespace, pod.name) in self._pods:
                raise KubeletError(f"pod {pod.namespace}/{pod.name} is already admitted")
            self._pods[(pod.namespace, pod.name)] = pod
            self._write_checkpoint()

    def remove(self, namespace: str, name: str) -> AdmittedPod:
        """The pod ended: its devices are free again."""
        with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                raise KubeletError(f"no pod {namespace}/{name} admitted")
            self._write_checkpoint()
        return pod

    def pods(self) -> list[AdmittedPod]:
        with self._lock:
            return list(self._pods.values())

    def get(self, namespace: str, name: str) -> AdmittedPod | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def held(self, resource: str) -> set[str]:
        """The device IDs of `resource` some container holds."""
        with self._lock:
            return {
                i
                for p in self._pods.values()
                for a in p.assignments
                if a.resource == resource
                for i in a.device_ids
            }

    def _write_checkpoint(self) -> None:
        devices = self._devices()
        entries = [
            {
                "PodUID": pod.uid,
                "ContainerName": a.container,
                "ResourceName": a.resource,
                "DeviceIDs": _by_numa(a.device_ids, devices.get(a.resource, {})),
                "AllocResp": base64.b64encode(a.response.SerializeToString()).decode(),
            }
            for pod in self._pods.values()
            for a in pod.assignments
        ]
        registered = {name: sorted(listed) for name, listed in devices.items()}
        data = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}, "Checksum": 0}
        write_atomic(self._checkpoint, json.dumps(data).encode(), mode=0o600)


def _by_numa(ids: tuple[str, ...], devices: Mapping[str, DeviceState]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for device_id in ids:
        state = devices.get(device_id)
        node = state.numa_nodes[0] if state is not None and state.numa_nodes else NO_NUMA_NODE
        found.setdefault(str(node), []).append(device_id)
    return found


def _pod_message(pod: AdmittedPod, devices: Mapping[str, Mapping[str, DeviceState]]) -> Any:
    message = podresources_pb.PodResources(name=pod.name, namespace=pod.namespace)
    containers: dict[str, Any] = {}
    for a in pod.assignments:
        container = containers.get(a.container)
        if container is None:
            container = containers[a.container] = message.containers.add(name=a.container)
        for device_id in a.device_ids:
            container.devices.append(_devices(a.resource, device_id, devices.get(a.resource, {})))
    return message


def _devices(resource: str, device_id: str, known: Mapping[str, DeviceState]) -> Any:
    state = known.get(device_id)
    nodes = [podresources_pb.NUMANode(ID=n) for n in (state.numa_nodes if state else ())]
    return podresources_pb.ContainerDevices(
        resource_name=resource, device_ids=[device_id], topology=podresources_pb.TopologyInfo(nodes=nodes)
    )


class _Lister:
    """The PodResourcesLister servicer over the admitted pods and the device lists."""

    def __init__(self, pods: AdmittedPods, devices: DeviceLists) -> None:
        self._pods, self._devices = pods, devices

    def List(self, request: Any, context: Any) -> Any:
        devices = self._devices()
        answer = podresources_pb.ListPodResourcesResponse()
        answer.pod_resources.extend(_pod_message(pod, devices) for pod in self._pods.pods())
        return answer

    def Get(self, request: Any, context: Any) -> Any:
        pod = self._pods.get(request.pod_namespace, request.pod_name)
        if pod is None:  # the kubelet answers a plain error: UNKNOWN on the wire
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} not found in namespace {request.pod_namespace}",
            )
            raise AssertionError("context.abort returned")
        return podresources_pb.GetPodResourcesResponse(pod_resources=_pod_message(pod, self._devices()))

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        answer = podresources_pb.AllocatableResourcesResponse()
        for resource, listed in sorted(self._devices().items()):
            answer.devices.extend(_devices(resource, device_id, listed) for device_id in listed)
        return answer


class PodResourcesServer:
    """Serves the PodResources API of `pods` at `socket_path`; `serve` and `stop` one at a time."""

    def __init__(self, socket_path: Path, pods: AdmittedPods, devices: DeviceLists) -> None:
        self.socket_path = socket_path
        self._lister = _Lister(pods, devices)
        self._server: grpc.Server | None = None

    def serve(self) -> None:
        make_dirs(self.socket_path.parent)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(ThreadPoolExecutor(2, thread_name_prefix="kubelet-podresources"))
        podresources_grpc.add_PodResourcesListerServicer_to_server(self._lister, server)
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as error:
            raise KubeletError(f"cannot serve {self.socket_path}: {error}") from error
        server.start()
        self._server = server
        log.info("kubelet serving PodResources socket=%s", self.socket_path)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop(None).wait()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
