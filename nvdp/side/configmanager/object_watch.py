"""The config-manager's list+watch of one named object (its own Node; the ConfigMap it reads), on
nvdp's one watch loop (`nvdp.kube.reflector.Reflector`: client-go's backoff, malformed events and other
objects' events skipped, never stopped).

Each watch asks the server to end it after about WATCH_TIMEOUT_S (then resumed from the last
resourceVersion, no list), so a healthy server always says something within WATCH_SILENCE_S; a
stream silent that long is taken for dead (a half-open connection, a stalled server) and dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from nvdp import kube
from nvdp.kube.configmaps import ConfigMapData, configmaps_path
from nvdp.kube.reflector import DEFAULT_TIMERS, Reflector, WatchTimers

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = WatchTimers.timeout_s
WATCH_SILENCE_S = WatchTimers.silence_s

T = TypeVar("T")


class _NamedObject:
    """The list and watch requests of the object `name` of the collection at `path` (field selector
    metadata.name=<name>)."""

    def __init__(self, api_client: Any, path: str, name: str) -> None:
        self._api_client, self._path = api_client, path
        self.selector = f"metadata.name={name}"

    def list(self) -> tuple[list[object], str]:
        found = kube.get_json(self._api_client, self._path, {"fieldSelector": self.selector}, 30)
        items = found.get("items")
        return list(items) if isinstance(items, list) else [], str(found["metadata"]["resourceVersion"])

    def watch(self, since: str, *, timeout_seconds: int, silence: float) -> Any:
        query = {
            "fieldSelector": self.selector,
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            "watch": "true",
        }
        return kube.watch(self._api_client, self._path, query, silence=silence)


class ObjectWatch(Generic[T]):
    """List+watch the object `name` of the collection at `path` and hand it, decoded, to
    `on_object(obj, listed)` (obj None when there is no such object; `listed`: it comes from a list,
    so it is the object's state now, not an event a resumed watch replays); events about other
    objects are skipped. `on_failure(message, failing_for_seconds)` hears each failure (a watch
    ending at once is one), and `on_recovered()` the first success after. The client should make no
    retries of its own (`kube.new_api_client(retries=0)`): each would add a whole silence bound
    before a failure is seen. `kind` names the object in log lines, `consequence` says in the alarm
    line what does not work meanwhile; `timers`: see `WatchTimers`."""

    def __init__(
        self,
        api_client: Any,
        path: str,
        name: str,
        decode: Callable[[Mapping[str, Any]], T],
        on_object: Callable[[T | None, bool], None],
        *,
        kind: str,
        object_kind: str,
        subject: str,
        consequence: str,
        on_failure: Callable[[str, float], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        timers: WatchTimers = DEFAULT_TIMERS,
    ) -> None:
        self._name, self._decode, self._on_object = name, decode, on_object
        self.kind = kind
        self.reflector = Reflector(
            _NamedObject(api_client, path, name),
            kind=kind,
            subject=subject,
            consequence=consequence,
            ours=self._ours,
            on_list=self._listed,
            on_event=self._event,
            object_kind=object_kind,
            timers=timers,
            on_failure=on_failure,
            on_recovered=on_recovered,
            logger=log,
        )

    @property
    def failing_since(self) -> float | None:
        return self.reflector.failing_since

    @property
    def last_error(self) -> str:
        """The last failure's message, while failing."""
        return self.reflector.last_error if self.reflector.failing_since is not None else ""

    @property
    def lists(self) -> int:
        return self.reflector.lists

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set (checked between requests and events)."""
        self.reflector.run(stop)

    def _ours(self, obj: dict[str, Any]) -> bool:
        return bool((obj.get("metadata") or {}).get("name") == self._name)

    def _listed(self, items: list[dict[str, Any]]) -> None:
        self._on_object(self._decode(items[0]) if items else None, True)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self._on_object(None if kind == "DELETED" else self._decode(obj), False)


class NodeWatch(ObjectWatch[kube.NodeMeta]):
    """The own Node's labels and annotations, to `on_node` (None: the Node is gone)."""

    def __init__(
        self, api_client: Any, node_name: str, on_node: Callable[[kube.NodeMeta | None], None], **options: Any
    ) -> None:
        super().__init__(
            api_client,
            "/api/v1/nodes",
            node_name,
            kube.NodeMeta.of,
            lambda node, _listed: on_node(node),
            kind="node",
            object_kind="Node",
            subject=node_name,
            consequence="the config is not following the node label until it recovers",
            **options,
        )


class ConfigMapWatch(ObjectWatch[ConfigMapData]):
    """The ConfigMap `namespace/name`'s entries, to `on_configmap(data, listed)` (None: there is no
    such ConfigMap)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        on_configmap: Callable[[ConfigMapData | None, bool], None],
        **options: Any,
    ) -> None:
        super().__init__(
            api_client,
            configmaps_path(namespace),
            name,
            ConfigMapData.of,
            on_configmap,
            kind="configmap",
            object_kind="ConfigMap",
            subject=f"{namespace}/{name}",
            consequence="ConfigMap edits reach this node only through its mounted copy until it recovers",
            **options,
        )
