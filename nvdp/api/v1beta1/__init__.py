"""Generated code of the kubelet device-plugin API v1beta1 (from api/deviceplugin/v1beta1/api.proto).

Import it through `nvdp.api`, its one importer.
"""
