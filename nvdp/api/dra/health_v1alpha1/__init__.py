"""Generated code of the kubelet DRA resource health API v1alpha1 (from api/dra-health/v1alpha1/api.proto).

Import it through `nvdp.api.dra`, its one importer.
"""
