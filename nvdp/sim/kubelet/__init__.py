"""Kubelet stand-in: the kubelet's side of the device-plugin and DRA protocols, in process, for the
test suite, `nvdp simulate` and the benchmarks.

- `manager` (`Kubelet`) wires the Registration server (`registration`), one endpoint per plugin
  (`endpoint`) and the device state (`state`), which talk through `PluginHandler` and
  `ListAndWatchReceiver`.
- `admission` admits pods; `pod_resources` serves their devices on the PodResources API;
  `node_status` writes device counts into a Node's status, late, as the kubelet does.
- For DRA: `plugin_watcher` (the plugins_registry watcher) and `dra` (the DRA manager).
"""

from nvdp.base.errors import KubeletError, PluginNotConnected
from nvdp.sim.kubelet.endpoint import ListAndWatchReceiver, PluginEndpoint, StreamEnd
from nvdp.sim.kubelet.manager import Kubelet
from nvdp.sim.kubelet.pod_resources import AdmittedPod, Assignment
from nvdp.sim.kubelet.registration import (
    CHECKPOINT_FILE,
    KUBELET_SOCKET,
    PluginHandler,
    Registration,
    RegistrationServer,
    Rejection,
    SocketState,
    cleanup_plugin_dir,
)
from nvdp.sim.kubelet.state import DeviceManagerState, DeviceState, Update
from nvdp.sim.kubelet.validation import is_extended_resource_name

__all__ = [
    "CHECKPOINT_FILE",
    "AdmittedPod",
    "Assignment",
    "KUBELET_SOCKET",
    "DeviceManagerState",
    "DeviceState",
    "Kubelet",
    "KubeletError",
    "ListAndWatchReceiver",
    "PluginEndpoint",
    "PluginHandler",
    "PluginNotConnected",
    "Registration",
    "RegistrationServer",
    "Rejection",
    "SocketState",
    "StreamEnd",
    "Update",
    "cleanup_plugin_dir",
    "is_extended_resource_name",
]
