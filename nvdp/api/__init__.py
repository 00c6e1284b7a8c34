"""The kubelet APIs nvdp speaks: the one importer of the generated protobuf code.

The device-plugin API (v1beta1): everything else imports `pb` (messages) and `pb_grpc` (stubs and
servicers) from here. The PodResources API (v1, the kubelet's record of which container holds which
device): `podresources_pb` and `podresources_grpc`.
"""

from typing import Any

from nvdp.api.podresources_v1 import api_pb2 as podresources_pb
from nvdp.api.podresources_v1 import api_pb2_grpc as _podresources_grpc
from nvdp.api.v1beta1 import api_pb2 as pb
from nvdp.api.v1beta1 import api_pb2_grpc as _pb_grpc

# grpc's generated stubs carry no type hints: say so once here instead of at every call.
pb_grpc: Any = _pb_grpc
podresources_grpc: Any = _podresources_grpc

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

__all__ = ["API_VERSION", "HEALTHY", "UNHEALTHY", "pb", "pb_grpc", "podresources_grpc", "podresources_pb"]
