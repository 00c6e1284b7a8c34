"""Generated code of the kubelet plugin registration API v1 (from api/pluginregistration/v1/api.proto).

Import it through `nvdp.api.dra`, its one importer.
"""
