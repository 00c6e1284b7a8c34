"""Generated code of the kubelet PodResources API v1 (from api/podresources/v1/api.proto).

Import it through `nvdp.api`, its one importer.
"""
