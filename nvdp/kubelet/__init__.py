"""Kubelet stand-in: the kubelet's side of the device-plugin protocol, in process.

Used by the test suite, `nvdp simulate` and the benchmarks. See `nvdp.kubelet.manager.Kubelet`.
"""

from nvdp.kubelet.endpoint import StreamEnd
from nvdp.kubelet.manager import (
    CHECKPOINT_FILE,
    KUBELET_SOCKET,
    DeviceState,
    Kubelet,
    KubeletError,
    PluginNotConnected,
    Registration,
    Rejection,
    Update,
    cleanup_plugin_dir,
)
from nvdp.kubelet.validation import is_extended_resource_name

__all__ = [
    "CHECKPOINT_FILE",
    "KUBELET_SOCKET",
    "DeviceState",
    "Kubelet",
    "KubeletError",
    "PluginNotConnected",
    "Registration",
    "Rejection",
    "StreamEnd",
    "Update",
    "cleanup_plugin_dir",
    "is_extended_resource_name",
]
