"""Talking to the Kubernetes API server. `client` is the only importer of the `kubernetes` client
(lazily: importing this package costs nothing); `events` (Events on the Node or on the
pods a GPU fault hits), `nodes` (the Node's labels and annotations), `node_status` (the Node's
conditions and taints), `nodefeature` (NFD's NodeFeature objects), `pods` (this process's pod:
owner references) and `daemonsets` (whether that pod's DaemonSet goes) are requests built on it;
`reflector` is the one list+watch loop of every watch. The package is a leaf: it imports nothing of
nvdp but `nvdp.base.errors` and the leaves `nvdp.base.backoff`, `nvdp.base.bounded`, `nvdp.base.files`. Its
callers reach it through small protocols of their own (e.g. `nvdp.node.health.event_sender.EventClient`)."""

from nvdp.kube.client import SERVICE_ACCOUNT_TOKEN, get_json, in_cluster, new_api_client, watch
from nvdp.kube.daemonsets import daemonset_exists, delete_daemonset, owner_daemonset_removed
from nvdp.kube.events import EVENT_SOURCE, NODE_EVENTS_NAMESPACE, Involved, KubeEvents
from nvdp.kube.node_status import KubeNodeStatus, NodeConditionsAndTaints
from nvdp.kube.nodefeature import (
    NODE_FEATURE_GROUP,
    NODE_FEATURE_NODE_LABEL,
    NODE_FEATURE_PLURAL,
    NODE_FEATURE_VERSION,
    apply_node_feature,
    node_feature_api_served,
    node_feature_body,
)
from nvdp.kube.nodes import NodeMeta, node_metadata, patch_node_annotations
from nvdp.kube.pods import OwnerReference, pod_owner_references

__all__ = [
    "EVENT_SOURCE",
    "NODE_EVENTS_NAMESPACE",
    "NODE_FEATURE_GROUP",
    "NODE_FEATURE_NODE_LABEL",
    "NODE_FEATURE_PLURAL",
    "NODE_FEATURE_VERSION",
    "SERVICE_ACCOUNT_TOKEN",
    "Involved",
    "KubeEvents",
    "KubeNodeStatus",
    "NodeConditionsAndTaints",
    "NodeMeta",
    "OwnerReference",
    "apply_node_feature",
    "daemonset_exists",
    "delete_daemonset",
    "get_json",
    "in_cluster",
    "new_api_client",
    "node_feature_api_served",
    "node_feature_body",
    "node_metadata",
    "owner_daemonset_removed",
    "patch_node_annotations",
    "pod_owner_references",
    "watch",
]
