"""Device health: XID policy (`xid`) and the health state machine (`state`), both pure, the node's NVML
monitor thread (`monitor`), routing to plugin servers (`router`), the node's health put together
(`node`), Kubernetes Events on the Node and the pods a transition hits (`node_events`,
`pod_events`, sent by `event_sender`), the Node's GPU health condition and
taint (`condition`, pure, written by `node_condition`), value types and seams (`types`)."""

from nvdp.node.health.monitor import HealthMonitor
from nvdp.node.health.router import HealthRouter, NodeEventSink
from nvdp.node.health.types import HealthChange, HealthSettings, HealthTarget, MonitorStatus
from nvdp.node.health.xid import APPLICATION_XIDS, DEFAULT_FATAL_XIDS, Verdict, XidPolicy, xid_reason

__all__ = [
    "APPLICATION_XIDS",
    "DEFAULT_FATAL_XIDS",
    "HealthChange",
    "HealthMonitor",
    "HealthRouter",
    "HealthSettings",
    "HealthTarget",
    "MonitorStatus",
    "NodeEventSink",
    "Verdict",
    "XidPolicy",
    "xid_reason",
]
