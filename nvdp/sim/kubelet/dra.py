"""The kubelet's DRA manager, for the stand-in: NodePrepareResources and NodeUnprepareResources to a
registered DRA plugin, through the service the plugin watcher chose.

- Claims are reference-counted by the pods using them: prepared for the first, unprepared after
  the last.
- The plugin's DRAResourceHealth stream is followed (what the kubelet shows in pods' status).
- A pod asking an extended resource a DeviceClass serves (KEP-5004) names no claim: the scheduler's
  claim is in `status.extendedResourceClaimStatus`; `start_extended_resource_pod` prepares it and
  gives each container the CDI devices of its requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from nvdp.api.dra import DRA_PLUGIN, RESOURCE_HEALTH
from nvdp.base.errors import KubeletError
from nvdp.sim.kubelet.plugin_watcher import DraRegistration, PluginWatcher

log = logging.getLogger(__name__)


class Claim(NamedTuple):
    namespace: str
    name: str
    uid: str


@dataclass
class ClaimInUse:
    """What the plugin answered for a claim, and the pods using it."""

    devices: list[Any]  # the answer's Device messages
    pods: set[str] = field(default_factory=set)


class DraManager:
    """Calls the DRA plugins the `watcher` registered. Thread-safe."""

    def __init__(self, watcher: PluginWatcher, rpc_timeout: float = 10.0) -> None:
        self.watcher = watcher
        self.rpc_timeout = rpc_timeout
        self.prepared: dict[str, ClaimInUse] = {}  # claim uid -> answer and pods
        self.health: dict[str, dict[str, Any]] = {}  # driver -> device name -> its last DeviceHealth
        self.health_updates: list[tuple[str, float]] = []  # (driver, time.monotonic()) of each message
        self._lock = threading.Condition()
        self._channels: dict[str, grpc.Channel] = {}

    def plugin(self, driver: str) -> DraRegistration:
        found = self.watcher.plugins.get(driver)
        if found is None:
            raise KubeletError(f"DRA driver {driver} is not registered")
        return found

    def _stub(self, driver: str) -> tuple[Any, Any]:
        plugin = self.plugin(driver)
        wire = DRA_PLUGIN[plugin.service]
        with self._lock:
            channel = self._channels.get(plugin.endpoint)
            if channel is None:
                channel = self._channels[plugin.endpoint] = grpc.insecure_channel(f"unix://{plugin.endpoint}")
        return wire.grpc.DRAPluginStub(channel), wire.pb

    def node_prepare(self, driver: str, claims: Sequence[Claim]) -> Any:
        stub, pb = self._stub(driver)
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
        )
        return stub.NodePrepareResources(request, timeout=self.rpc_timeout)

    def node_unprepare(self, driver: str, claims: Sequence[Claim]) -> Any:
        stub, pb = self._stub(driver)
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
        )
        return stub.NodeUnprepareResources(request, timeout=self.rpc_timeout)

    def start_pod(self, pod_uid: str, driver: str, claims: Sequence[Claim]) -> dict[str, list[Any]]:
        """Prepare the pod's claims no other pod prepared; claim uid -> its devices. Raises
        KubeletError naming a claim the plugin could not prepare (the pod does not start)."""
        with self._lock:
            todo = [c for c in claims if c.uid not in self.prepared]
        if todo:
            answer = self.node_prepare(driver, todo)
            for claim in todo:
                result = answer.claims.get(claim.uid)
                if result is None or result.error:
                    raise KubeletError(
                        f"claim {claim.namespace}/{claim.name}: {result.error if result else 'no answer'}"
                    )
            with self._lock:
                for claim in todo:
                    self.prepared.setdefault(claim.uid, ClaimInUse(list(answer.claims[claim.uid].devices)))
        with self._lock:
            for claim in claims:
                self.prepared[claim.uid].pods.add(pod_uid)
            return {c.uid: self.prepared[c.uid].devices for c in claims}

    def start_extended_resource_pod(
        self, pod: Mapping[str, Any], claim_uid: str, driver: str
    ) -> dict[str, list[str]]:
        """Prepare the claim the pod's `status.extendedResourceClaimStatus` names (its UID as the API
        has it); container name -> the CDI device IDs the container gets. Raises KubeletError: no such
        status, or the claim not prepared."""
        status = (pod.get("status") or {}).get("extendedResourceClaimStatus")
        metadata = pod["metadata"]
        if not status:
            raise KubeletError(
                f"pod {metadata['namespace']}/{metadata['name']}: no extendedResourceClaimStatus"
            )
        claim = Claim(metadata["namespace"], status["resourceClaimName"], claim_uid)
        devices = self.start_pod(metadata["uid"], driver, [claim])[claim_uid]
        return container_cdi_devices(pod, devices)

    def end_pod(self, pod_uid: str, driver: str, claims: Sequence[Claim]) -> list[str]:
        """Unprepare the pod's claims no other pod uses; the uids unprepared."""
        with self._lock:
            for claim in claims:
                if claim.uid in self.prepared:
                    self.prepared[claim.uid].pods.discard(pod_uid)
            last = [c for c in claims if c.uid in self.prepared and not self.prepared[c.uid].pods]
        if not last:
            return []
        answer = self.node_unprepare(driver, last)
        done = [c.uid for c in last if c.uid in answer.claims and not answer.claims[c.uid].error]
        with self._lock:
            for uid in done:
                del self.prepared[uid]
        return done

    def watch_health(self, driver: str) -> threading.Thread:
        """Follow the plugin's health stream on a thread until the plugin ends it."""
        plugin = self.plugin(driver)
        if not plugin.health_service:
            raise KubeletError(f"DRA driver {driver} serves no resource health service")
        wire = RESOURCE_HEALTH[plugin.health_service]

        def follow() -> None:
            with grpc.insecure_channel(f"unix://{plugin.endpoint}") as channel:
                stub = wire.grpc.DRAResourceHealthStub(channel)
                try:
                    for response in stub.NodeWatchResources(wire.pb.NodeWatchResourcesRequest()):
                        with self._lock:
                            self.health[driver] = {d.device.device_name: d for d in response.devices}
                            self.health_updates.append((driver, time.monotonic()))
                            self._lock.notify_all()
                except grpc.RpcError as error:
                    log.info("health stream ended driver=%s code=%s", driver, error.code().name)

        thread = threading.Thread(target=follow, name=f"kubelet-health-{driver}", daemon=True)
        thread.start()
        return thread

    def wait_for_health(self, driver: str, device: str, healthy: bool, timeout: float) -> Any:
        """The device's DeviceHealth once the stream says it is (un)healthy."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = self.health.get(driver, {}).get(device)
                if found is not None and (found.health == 1) == healthy:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{driver} {device} not {'healthy' if healthy else 'unhealthy'} within {timeout}s"
                    )
                self._lock.wait(left)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()


def container_cdi_devices(pod: Mapping[str, Any], devices: Sequence[Any]) -> dict[str, list[str]]:
    """Each container's CDI device IDs (every container of the pod): those of the prepared `devices`
    (the plugin's Device messages) whose requests the pod's extendedResourceClaimStatus maps to the
    container; a device that names no request belongs to every request."""
    spec = pod.get("spec") or {}
    found: dict[str, list[str]] = {
        c["name"]: [] for c in (*(spec.get("initContainers") or []), *(spec.get("containers") or []))
    }
    for mapping in pod["status"]["extendedResourceClaimStatus"]["requestMappings"]:
        for device in devices:
            if not device.request_names or mapping["requestName"] in device.request_names:
                found[mapping["containerName"]] += list(device.cdi_device_ids)
    return found
