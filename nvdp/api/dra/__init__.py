"""The kubelet's DRA plugin APIs (dra v1 and v1beta1, dra-health v1alpha1 and v1) and its plugin
registration API (pluginregistration v1): the one importer of their generated protobuf code.

Everything else takes the versions from here: `DRA_PLUGIN` and `RESOURCE_HEALTH` map the service
names a plugin lists in its registration's supported versions ("v1.DRAPlugin", ...) to the wire of
that version (its messages and its gRPC stubs and servicers), newest first; `registration` is the
registration API's.
"""

from dataclasses import dataclass
from typing import Any

from nvdp.api.dra.health_v1 import api_pb2 as _health_v1
from nvdp.api.dra.health_v1 import api_pb2_grpc as _health_v1_grpc
from nvdp.api.dra.health_v1alpha1 import api_pb2 as _health_v1alpha1
from nvdp.api.dra.health_v1alpha1 import api_pb2_grpc as _health_v1alpha1_grpc
from nvdp.api.dra.registration_v1 import api_pb2 as _registration
from nvdp.api.dra.registration_v1 import api_pb2_grpc as _registration_grpc
from nvdp.api.dra.v1 import api_pb2 as _dra_v1
from nvdp.api.dra.v1 import api_pb2_grpc as _dra_v1_grpc
from nvdp.api.dra.v1beta1 import api_pb2 as _dra_v1beta1
from nvdp.api.dra.v1beta1 import api_pb2_grpc as _dra_v1beta1_grpc

PLUGIN_TYPE = "DRAPlugin"  # PluginInfo.type of a DRA driver's kubelet plugin


@dataclass(frozen=True)
class Wire:
    """One version of one service: its name in the supported versions, its messages (`pb`) and its
    gRPC stubs and servicers (`grpc`; grpc's generated code has no type hints: Any, said once)."""

    service: str
    pb: Any
    grpc: Any


DRA_PLUGIN = {
    "v1.DRAPlugin": Wire("v1.DRAPlugin", _dra_v1, _dra_v1_grpc),
    "v1beta1.DRAPlugin": Wire("v1beta1.DRAPlugin", _dra_v1beta1, _dra_v1beta1_grpc),
}
RESOURCE_HEALTH = {
    "v1.DRAResourceHealth": Wire("v1.DRAResourceHealth", _health_v1, _health_v1_grpc),
    "v1alpha1.DRAResourceHealth": Wire("v1alpha1.DRAResourceHealth", _health_v1alpha1, _health_v1alpha1_grpc),
}
registration = Wire("pluginregistration.Registration", _registration, _registration_grpc)

__all__ = ["DRA_PLUGIN", "PLUGIN_TYPE", "RESOURCE_HEALTH", "Wire", "registration"]
