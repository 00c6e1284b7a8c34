"""Generated code of the kubelet DRA plugin API v1beta1 (from api/dra/v1beta1/api.proto).

Import it through `nvdp.api.dra`, its one importer.
"""
