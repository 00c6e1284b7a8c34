"""A client of the kubelet's PodResources API (v1) on its unix socket: which container holds which
device, as plain `Holding`s. The generated code is loaded at the first read of a socket that exists.

The socket is `<kubelet root>/pod-resources/kubelet.sock`; the kubelet's root is the parent of the
device-plugin directory (`--kubelet-socket`'s). One channel, opened on the first read and kept (gRPC
reconnects by path when the kubelet restarts); every call has a deadline. Only `List` is needed: it
names every pod with devices, and one answer is the whole record.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import grpc

from nvdp.base.errors import PodResourcesUnavailable
from nvdp.plugins.ledger.types import Holding

POD_RESOURCES_DIR = "pod-resources"
POD_RESOURCES_SOCKET = "kubelet.sock"
LIST_TIMEOUT_S = 2.0
# Bounds on one answer, so that a kubelet (or a process in its place) cannot grow the plugin: a node
# of a few hundred pods answers in well under 1 MiB and names at most its GPUs x 1024 replicas.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_HOLDINGS = 16384


def pod_resources_socket(kubelet_socket: Path) -> Path:
    """The PodResources socket of the kubelet whose registration socket is `kubelet_socket`."""
    return kubelet_socket.parent.parent / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET


def holdings_of(answer: Any, prefix: str, limit: int = MAX_HOLDINGS) -> list[Holding]:
    """The device holdings of a ListPodResourcesResponse, for resources named `prefix`...; a device
    listed twice for one container (the kubelet repeats init containers' devices) counts once.
    Raises PodResourcesUnavailable past `limit` holdings."""
    found: dict[Holding, None] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(prefix):
                    continue
                for device_id in devices.device_ids:
                    holding = Holding(
                        devices.resource_name, device_id, pod.namespace, pod.name, container.name
                    )
                    found[holding] = None
                if len(found) > limit:
                    raise PodResourcesUnavailable(
                        f"PodResources answer names more than {limit} devices of {prefix}*; not read"
                    )
    return list(found)


class PodResourcesClient:
    """Reads the PodResources API at `socket_path`. Thread-safe; `close()` is idempotent."""

    def __init__(self, socket_path: Path, *, timeout: float = LIST_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None

    def list(self, prefix: str) -> list[Holding]:
        """Every device of a resource named `prefix`... that a container holds. Raises
        PodResourcesUnavailable (one line) when there is no socket or the kubelet does not answer."""
        if not os.path.exists(self.socket_path):
            raise PodResourcesUnavailable(f"no PodResources socket at {self.socket_path}")
        from nvdp.api.podresources import podresources_pb  # loaded once a socket is there

        try:
            answer = self._lister().List(podresources_pb.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as error:
            raise PodResourcesUnavailable(
                f"PodResources List on {self.socket_path} failed: {error.code().name}: {error.details()}"
            ) from error
        except ValueError as error:  # grpc: the channel was closed under the call (stop)
            raise PodResourcesUnavailable(
                f"PodResources List on {self.socket_path} failed: {error}"
            ) from error
        return holdings_of(answer, prefix)

    def _lister(self) -> Any:
        from nvdp.api.podresources import podresources_grpc

        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket_path}",
                    options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)],
                )
                self._stub = podresources_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
