"""The DRA kubelet plugin's gRPC services on two unix sockets, as kubeletplugin's layout expects.

- `<plugins_registry>/gpu.nvidia.com-reg.sock`: Registration. GetInfo says DRAPlugin, the driver,
  the DRA socket and its services ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
  "v1alpha1.DRAResourceHealth"); NotifyRegistrationStatus is logged.
- `<plugins>/gpu.nvidia.com/dra.sock`: DRAPlugin v1 / v1beta1 (one answer per claim,
  `nvdp.plugins.dra.prepare`, each told to a `RequestObserver`) and DRAResourceHealth
  (`nvdp.plugins.dra.health`).
- One `UnixSocketServer` listens on both (0600); when one is removed or replaced, `nvdp.plugins.dra.loop`
  serves both again and the kubelet registers the plugin again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from nvdp.api.dra import DRA_PLUGIN, PLUGIN_TYPE, RESOURCE_HEALTH, Wire
from nvdp.plugins.dra.claims import ClaimRef
from nvdp.plugins.dra.health import HealthStreams
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.prepare import ClaimPreparer
from nvdp.plugins.kubeletplugin.registration import RegistrationService

SERVICES = (*DRA_PLUGIN, *RESOURCE_HEALTH)  # the supported versions GetInfo names, newest first


def dra_registration(
    endpoint: Path,
    on_registered: Callable[[bool], None] | None = None,
    on_info: Callable[[], None] | None = None,
) -> RegistrationService:
    """The Registration service of the driver whose DRA socket is `endpoint`."""
    return RegistrationService(
        PLUGIN_TYPE, DRIVER_NAME, endpoint, SERVICES, on_registered=on_registered, on_info=on_info
    )


class RequestObserver(Protocol):
    """Told of every NodePrepareResources / NodeUnprepareResources answered (`nvdp.plugins.dra.status`)."""

    def request_done(self, method: str, code: grpc.StatusCode, seconds: float, errors: Sequence[str]) -> None:
        """`method` answered with `code` after `seconds`; `errors`: each claim's error ("" when none)."""
        ...


class DraService:
    """DRAPlugin of one version (the kubelet picks the newest it knows of those GetInfo names)."""

    def __init__(self, wire: Wire, preparer: ClaimPreparer, observer: RequestObserver | None = None) -> None:
        self._pb = wire.pb
        self._preparer = preparer
        self._observer = observer

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started, errors = time.monotonic(), None
        try:
            answers = self._preparer.prepare([_ref(c) for c in request.claims])
            errors = [answer.error for answer in answers.values()]
        finally:
            self._done("NodePrepareResources", started, errors)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if answer.error:
                entry.error = answer.error
                continue
            for d in answer.devices:
                entry.devices.add(
                    request_names=list(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started, errors = time.monotonic(), None
        try:
            answers = self._preparer.unprepare([_ref(c) for c in request.claims])
            errors = list(answers.values())
        finally:
            self._done("NodeUnprepareResources", started, errors)
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response

    def _done(self, method: str, started: float, errors: Sequence[str] | None) -> None:
        """Count one answer; `errors` None: the call failed as a whole (a bug: gRPC answers UNKNOWN)."""
        if self._observer is not None:
            code = grpc.StatusCode.OK if errors is not None else grpc.StatusCode.UNKNOWN
            self._observer.request_done(method, code, time.monotonic() - started, errors or ())


class HealthService:
    """DRAResourceHealth of one version."""

    def __init__(self, wire: Wire, streams: HealthStreams) -> None:
        self._wire = wire
        self._streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._streams.stream(self._wire, context)


def add_plugin_services(
    server: grpc.Server,
    preparer: ClaimPreparer,
    streams: HealthStreams,
    observer: RequestObserver | None = None,
) -> None:
    for wire in DRA_PLUGIN.values():
        wire.grpc.add_DRAPluginServicer_to_server(DraService(wire, preparer, observer), server)
    for wire in RESOURCE_HEALTH.values():
        wire.grpc.add_DRAResourceHealthServicer_to_server(HealthService(wire, streams), server)


def _ref(claim: Any) -> ClaimRef:
    return ClaimRef(claim.namespace, claim.name, claim.uid)
