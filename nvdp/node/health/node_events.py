"""Kubernetes Node events (health transitions, misfits), sent off the path of what reports them
(`nvdp.node.health.event_sender`); `node_events_from_env` wires them in for the plugin, the DRA plugin
and gfd."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from nvdp import kube
from nvdp.kube import Involved
from nvdp.node.health.event_sender import Event, EventClient, EventSender, writer_from_env

log = logging.getLogger(__name__)


class NodeEventRecorder(EventSender):
    """Events on the Node `node`, posted with `client_factory()`'s client."""

    def __init__(self, client_factory: Callable[[], EventClient], *, node: str, max_queue: int = 64) -> None:
        super().__init__(client_factory, kind="node", max_queue=max_queue, log=log)
        self._node = Involved.node(node)

    def record(self, event_type: str, reason: str, message: str) -> None:
        """Queue one event; never blocks."""
        self.send(Event(self._node, event_type, reason, message))


def node_events_from_env(
    environ: Mapping[str, str],
    *,
    node: str | None = None,
    kubeconfig: str = "",
    component: str = kube.EVENT_SOURCE,
    token_file: str = kube.SERVICE_ACCOUNT_TOKEN,
    max_queue: int = 64,
) -> NodeEventRecorder | None:
    """A recorder for events on this node (`node`, else NODE_NAME) when the API server is reachable
    (`writer_from_env`); None otherwise (feature off)."""
    found = writer_from_env(
        environ, node=node, kubeconfig=kubeconfig, component=component, token_file=token_file
    )
    if found is None:
        return None
    name, writer = found
    return NodeEventRecorder(writer, node=name, max_queue=max_queue)
