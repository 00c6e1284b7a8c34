"""The kubelet device-plugin API (v1beta1): the one importer of its generated protobuf code.

Everything else imports `pb` (messages) and `pb_grpc` (stubs and servicers) from here. The kubelet's
PodResources API has an importer of its own, loaded only where it is spoken (`nvdp.api.podresources`).
"""

from typing import Any

from nvdp.api.v1beta1 import api_pb2 as pb
from nvdp.api.v1beta1 import api_pb2_grpc as _pb_grpc

# grpc's generated stubs carry no type hints: say so once here instead of at every call.
pb_grpc: Any = _pb_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

__all__ = ["API_VERSION", "HEALTHY", "UNHEALTHY", "pb", "pb_grpc"]
