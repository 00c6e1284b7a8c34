"""Generated code of the kubelet DRA plugin API v1 (from api/dra/v1/api.proto).

Import it through `nvdp.api.dra`, its one importer.
"""
