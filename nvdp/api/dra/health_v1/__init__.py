"""Generated code of the kubelet DRA resource health API v1 (from api/dra-health/v1/api.proto).

Import it through `nvdp.api.dra`, its one importer.
"""
