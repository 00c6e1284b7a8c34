"""The one place where nvdp errors become gRPC status codes, and where every RPC is accounted for.

`status_for` maps an error to its status: a bad request is INVALID_ARGUMENT, any other expected
(`NvdpError`) is FAILED_PRECONDITION, a bug is INTERNAL. `rpc` wraps a servicer method with that
mapping, one warning line per refused request (a traceback only for a bug), and one `rpc_done`
report per call to the servicer's `RpcObserver` (metrics; `AllocateNotice` also tells the allocation
ledger of each Allocate answered).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc

from nvdp.base.errors import NvdpError, RequestError
from nvdp.base.logs import log_event

log = logging.getLogger(__name__)

T = TypeVar("T")


class RpcObserver(Protocol):
    """Receives one call per finished RPC (metrics hook)."""

    def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None: ...


class AllocateNotice:
    """An RpcObserver that calls `allocated()` after each Allocate answered OK (the allocation ledger
    reads the kubelet's record then) and passes every call on to `inner` (the metrics), if any."""

    def __init__(self, allocated: Callable[[], None], inner: RpcObserver | None) -> None:
        self._allocated = allocated
        self._inner = inner

    def rpc_done(self, resource: str, method: str, code: grpc.StatusCode, seconds: float) -> None:
        if self._inner is not None:
            self._inner.rpc_done(resource, method, code, seconds)
        if method == "Allocate" and code is grpc.StatusCode.OK:
            self._allocated()


class Servicer(Protocol):
    """What `rpc` reads of the servicer it wraps (a `nvdp.plugins.deviceplugin.server.DevicePluginServer`)."""

    @property
    def resource_name(self) -> str: ...
    @property
    def observer(self) -> RpcObserver | None: ...


def status_for(error: Exception) -> grpc.StatusCode:
    """The gRPC status an error is reported with (the single mapping point)."""
    if isinstance(error, RequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, NvdpError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def rpc(method: Callable[..., T]) -> Callable[..., T]:
    """Map expected errors to status codes with one warning line; bugs get INTERNAL and a traceback.
    Reports every call's result and duration to the server's RpcObserver (metrics)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> T:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return method(self, request, context)
        except NvdpError as error:
            code = status_for(error)
            log_event(
                log,
                logging.WARNING,
                "request refused",
                resource=self.resource_name,
                method=name,
                error=str(error),
            )
            context.abort(code, str(error))
        except Exception as error:  # a bug: keep serving, tell the kubelet
            code = grpc.StatusCode.INTERNAL
            log.exception("internal error in %s resource=%s", name, self.resource_name)
            context.abort(code, f"internal error: {type(error).__name__}: {error}")
        finally:
            if self.observer is not None:
                self.observer.rpc_done(self.resource_name, name, code, time.perf_counter() - started)
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
