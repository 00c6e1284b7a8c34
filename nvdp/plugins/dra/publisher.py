"""Keeps this node's pool published: the ResourceSlices of `nvdp.plugins.dra.slices`, written when they change
and again when someone else changes or deletes them (the kubelet does at start).

- The publisher thread waits for `update()` or the watcher, lists this driver's slices of the node
  and creates, replaces, deletes until they match, bumping the generation when content changes
  (matching slices are left alone: a restart writes nothing); failures retry with capped backoff.
- The watcher (`nvdp.kube.reflector.Reflector`) follows the slices once synced; one not our own
  write that leaves a slice different or gone wakes the publisher.
- A dry-run create first tells whether the server keeps device taints (DRADeviceTaints): an
  Unhealthy device is tainted `NoSchedule`, else withdrawn; said in one line.
- A dry-run tells whether it keeps `allowMultipleAllocations` (DRAConsumableCapacity); if not,
  shared GPUs are published whole (one WARNING).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence

from nvdp.base.backoff import Backoff
from nvdp.base.errors import KubeError
from nvdp.base.logs import log_event
from nvdp.kube.reflector import DEFAULT_TIMERS, Reflector, WatchTimers
from nvdp.plugins.dra.capacity import unshared
from nvdp.plugins.dra.cluster import ResourceApi, SliceApi
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.slices import Slice, Taint, generation_of, pool_slices, same_content, slice_name

log = logging.getLogger(__name__)

PROBE_TIME = "1970-01-01T00:00:00Z"


class SlicePublisher:
    """`update()` the wanted devices and health; `start()`, an idempotent `stop()`. `published` is set
    once the slices first said what was wanted, and `on_published` is called with the devices they
    say after each sync; `taints` is None until the server was asked. `writes` counts the API writes,
    `failures` the syncs that failed (`failing`: why the last one did, until one succeeds)."""

    def __init__(
        self,
        api: ResourceApi,
        node: str,
        *,
        watch_timers: WatchTimers = DEFAULT_TIMERS,
        backoff: Backoff | None = None,
        on_published: Callable[[Sequence[DraDevice]], None] | None = None,
    ) -> None:
        self._api = api
        self._on_published = on_published  # told the devices the slices say, after each sync
        self.node = node
        self._retries = backoff or Backoff(0.5, 30.0)
        self._cond = threading.Condition()
        self._devices: list[DraDevice] = []
        self._unhealthy: dict[str, Taint] = {}
        self._dirty = False
        self._updated = False  # update() was called once (an empty pool is published too)
        self._stopping = False
        self._wanted: dict[str, Slice] = {}  # name -> the slice as last written or found right
        self._own: dict[str, str] = {}  # name -> resourceVersion of our last write
        self._synced = False  # the publisher's first sync is done (the watcher starts then)
        self._stop = threading.Event()
        self.reflector = Reflector(
            _NodeSlices(api, node),
            kind="resourceslice",
            subject=f"{node}/{DRIVER_NAME}",
            consequence="slices someone else edits or deletes are not published again until it recovers",
            ours=self._ours,
            on_list=self._listed,
            on_event=self._event,
            object_kind="ResourceSlice",
            timers=watch_timers,
            logger=log,
        )
        self.taints: bool | None = None
        self.sharing: bool | None = None  # whether the server keeps allowMultipleAllocations
        self._owner: dict[str, object] | None = None  # the Node's ownerReference, once read
        self._owner_said = False
        self.generation = 0
        self.writes = 0
        self.failures = 0
        self.failing: str | None = None
        self.published = threading.Event()
        self._threads: list[threading.Thread] = []

    def update(self, devices: Sequence[DraDevice], unhealthy: Mapping[str, Taint]) -> bool:
        """Want these devices and this health published; False when that was wanted already (a
        change elsewhere, a claim prepared, then costs the API server no list)."""
        wanted, bad = list(devices), dict(unhealthy)
        with self._cond:
            if self._updated and (wanted, bad) == (self._devices, self._unhealthy):
                return False
            self._updated = True
            self._devices, self._unhealthy = wanted, bad
            self._dirty = True
            self._cond.notify_all()
        return True

    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._publish_loop, "dra-publish"), (self._watch_loop, "dra-slice-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop both threads; the watcher is left to end with its request (the process is ending;
        `join` waits for it)."""
        self._stop.set()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._threads and self._threads[0] is not threading.current_thread():
            self._threads[0].join(timeout=5.0)

    def join(self, timeout: float) -> bool:
        """After `stop()`: wait at most `timeout` s for both threads (the watcher ends with its request:
        the server's timeout, or a stream the server closes); whether both ended."""
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def devices_by_type(self) -> dict[str, int]:
        """How many devices the slices say (as last written or found right), by their `type`."""
        with self._cond:
            said = [d for s in self._wanted.values() for d in s["spec"].get("devices") or []]
        counts: dict[str, int] = {}
        for device in said:
            kind = str(((device.get("attributes") or {}).get("type") or {}).get("string", ""))
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    # ---- publishing -----------------------------------------------------------------------------

    def _publish_loop(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                self._dirty = False
                devices, unhealthy = list(self._devices), dict(self._unhealthy)
            try:
                self._sync(devices, unhealthy)
                self._retries.reset()
                self.failing = None
                self.published.set()
                if self._on_published is not None:
                    self._on_published(devices)
            except KubeError as error:
                delay = self._retries.next()
                self.failures += 1
                self.failing = str(error)
                log_event(
                    log,
                    logging.WARNING,
                    "cannot publish ResourceSlices; will retry",
                    error=str(error),
                    retry_in=f"{delay:.1f}s",
                )
                with self._cond:
                    self._dirty = True
                    self._cond.wait_for(lambda: self._stopping, timeout=delay)

    def _sync(self, devices: Sequence[DraDevice], unhealthy: Mapping[str, Taint]) -> None:
        slices = self._api.slices()
        if self.taints is None and devices:
            self.taints = self._probe(slices, devices[0])
        devices = self._as_kept(slices, devices)
        taints, owner = bool(self.taints), self._node_owner()
        existing, _ = slices.list(self.node, DRIVER_NAME)
        found = {s["metadata"]["name"]: s for s in existing}
        wanted = pool_slices(self.node, self.generation, devices, unhealthy, taints=taints, owner=owner)
        if set(found) == {w["metadata"]["name"] for w in wanted} and all(
            same_content(found[w["metadata"]["name"]], w) for w in wanted
        ):
            self.generation = max([self.generation, *map(generation_of, existing)])
            self._settled({n: found[n] for n in found}, {})
            return
        self.generation = max([self.generation, *map(generation_of, existing)]) + 1
        wanted = pool_slices(self.node, self.generation, devices, unhealthy, taints=taints, owner=owner)
        written: dict[str, str] = {}
        for want in wanted:
            name = want["metadata"]["name"]
            if name in found:
                body = copy.deepcopy(want)
                body["metadata"]["resourceVersion"] = found[name]["metadata"].get("resourceVersion")
                answer = slices.replace(body)
            else:
                answer = slices.create(want)
            written[name] = str(answer["metadata"].get("resourceVersion"))
            self.writes += 1
        for name in set(found) - set(written):
            slices.delete(name)
            self.writes += 1
        log_event(
            log,
            logging.INFO,
            "ResourceSlices published",
            node=self.node,
            generation=self.generation,
            slices=len(wanted),
            devices=len(devices),
            unhealthy=len(unhealthy),
        )
        self._settled({w["metadata"]["name"]: w for w in wanted}, written)

    def _node_owner(self) -> dict[str, object] | None:
        """The Node's ownerReference (read until found); None, said once, while it cannot be read: the
        slices are published without it meanwhile (they would outlive a deleted Node)."""
        if self._owner is None:
            try:
                self._owner = self._api.node_owner(self.node)
                why = "" if self._owner is not None else "no Node of this name"
            except KubeError as error:
                why = str(error)
            if self._owner is None and not self._owner_said:
                log_event(
                    log,
                    logging.WARNING,
                    "ResourceSlices published without their Node as owner",
                    node=self.node,
                    why=why,
                )
                self._owner_said = True
        return self._owner

    def _settled(self, wanted: dict[str, Slice], written: dict[str, str]) -> None:
        with self._cond:
            self._wanted, self._own = wanted, written
            if not self._synced:
                self._synced = True
                self._cond.notify_all()

    def _probe(self, slices: SliceApi, device: DraDevice) -> bool:
        """Whether the server keeps a device's taints (a dry-run create: nothing is stored)."""
        probe = pool_slices(self.node, 0, [device], {device.name: Taint("probe", PROBE_TIME)}, taints=True)[
            -1
        ]
        probe["metadata"]["name"] = slice_name(self.node, 0) + "-taint-probe"
        kept = any("taints" in d for d in slices.create(probe, dry_run=True)["spec"].get("devices") or [])
        if kept:
            log_event(
                log,
                logging.INFO,
                "Unhealthy devices shown as device taints in the ResourceSlice",
                taint="gpu.nvidia.com/unhealthy:NoSchedule",
            )
        else:
            log_event(
                log,
                logging.INFO,
                "Unhealthy devices withdrawn from the ResourceSlice",
                why="the API server drops device taints (no DRADeviceTaints)",
            )
        return kept

    def _as_kept(self, slices: SliceApi, devices: Sequence[DraDevice]) -> Sequence[DraDevice]:
        """`devices`, those shared by capacity published whole where the server drops the field (a
        dry-run create with the first of them tells, once)."""
        shared = [d for d in devices if d.allow_multiple_allocations]
        if shared and self.sharing is None:
            probe = pool_slices(self.node, 0, shared[:1], {}, taints=False)[0]
            probe["metadata"]["name"] = slice_name(self.node, 0) + "-sharing-probe"
            answer = slices.create(probe, dry_run=True)["spec"].get("devices") or []
            self.sharing = any(d.get("allowMultipleAllocations") for d in answer)
            if not self.sharing:
                log_event(
                    log,
                    logging.WARNING,
                    "GPUs shared by capacity published whole",
                    why="the API server drops allowMultipleAllocations (no DRAConsumableCapacity)",
                )
        return devices if self.sharing or not shared else [unshared(d) for d in devices]

    # ---- watching ---------------------------------------------------------------------------------

    def watch_problem(self) -> str | None:
        """Why the slice watch counts as dead (failing for its alarm time); None while it works."""
        return self.reflector.problem()

    def _watch_loop(self) -> None:
        with self._cond:  # the watcher judges against what the publisher wanted: wait for its first sync
            self._cond.wait_for(lambda: self._synced or self._stopping)
        self.reflector.run(self._stop)

    def _ours(self, obj: Slice) -> bool:
        spec = obj.get("spec")
        return isinstance(spec, Mapping) and (spec.get("nodeName"), spec.get("driver")) == (
            self.node,
            DRIVER_NAME,
        )

    def _listed(self, slices: list[Slice]) -> None:
        """A list (the first, or one after 410 Gone): each slice judged as an event, and a wanted slice
        missing from it as deleted."""
        found = {str(s["metadata"].get("name")): s for s in slices}
        for name, obj in found.items():
            self._judge("ADDED", name, str(obj["metadata"].get("resourceVersion")), obj)
        with self._cond:
            missing = [name for name in self._wanted if name not in found]
        for name in missing:
            self._judge("DELETED", name, "", {})

    def _event(self, kind: str, obj: Slice) -> None:
        metadata = obj["metadata"]
        self._judge(kind, str(metadata.get("name")), str(metadata.get("resourceVersion")), obj)

    def _judge(self, kind: str, name: str, version: str, obj: Slice) -> None:
        """Wake the publisher when someone else left one of our slices saying something else."""
        with self._cond:
            if self._own.get(name) == version:
                return
            wanted = self._wanted.get(name)
            if wanted is None and kind == "DELETED":
                return
            if wanted is not None and kind != "DELETED" and same_content(obj, wanted):
                return
            log_event(
                log,
                logging.INFO,
                "ResourceSlice changed by someone else; publishing again",
                slice=name,
                event=kind,
            )
            self._dirty = True
            self._cond.notify_all()


class _NodeSlices:
    """The list and watch requests of one node's slices of this driver (`nvdp.kube.reflector.ListWatch`)."""

    def __init__(self, api: ResourceApi, node: str) -> None:
        self._api, self._node = api, node

    def list(self) -> tuple[list[Slice], str]:
        return self._api.slices().list(self._node, DRIVER_NAME)

    def watch(self, since: str, *, timeout_seconds: int, silence: float) -> Generator[object, None, None]:
        return self._api.slices().watch(
            self._node, DRIVER_NAME, since, timeout_seconds=timeout_seconds, silence=silence
        )
