"""The kubelet PodResources API (v1): the one importer of its generated protobuf code.

`podresources_pb` (messages) and `podresources_grpc` (stubs and servicers). Imported only where the
API is spoken: the allocation ledger's client, at its first read of a socket that is there, and the
kubelet stand-in; a plugin beside a kubelet without the API never loads it.
"""

from typing import Any

from nvdp.api.podresources_v1 import api_pb2 as podresources_pb
from nvdp.api.podresources_v1 import api_pb2_grpc as _podresources_grpc

# grpc's generated stubs carry no type hints: say so once here instead of at every call.
podresources_grpc: Any = _podresources_grpc

__all__ = ["podresources_grpc", "podresources_pb"]
