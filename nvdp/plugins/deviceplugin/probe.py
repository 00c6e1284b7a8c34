"""Whether a plugin server answers: one cheap RPC (GetDevicePluginOptions) over its socket with a short
deadline. What /readyz uses to prove the servers serve, not only that they were registered."""

from __future__ import annotations

from pathlib import Path

import grpc

from nvdp.api import pb, pb_grpc

PROBE_TIMEOUT_S = 0.5


def rpc_problem(socket_path: Path, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the server on `socket_path` answers GetDevicePluginOptions within `timeout`; else why
    not, in a few words (the gRPC status)."""
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=timeout)
    except grpc.RpcError as error:
        code = error.code() if isinstance(error, grpc.Call) else None
        return f"GetDevicePluginOptions: {code.name if code is not None else 'failed'}"
    finally:
        channel.close()
    return None
