"""A claim's sharing configs applied at prepare and undone at unprepare (`nvdp.plugins.dra.sharing` says which
config applies to which device).

- TimeSlicing on whole GPUs: compute mode DEFAULT (NVML), then the interval (`nvdp.plugins.dra.timeslice`);
  back to Default at unprepare. The GPUs set are kept in `<plugin dir>/timeslices.json`, so a
  restarted plugin still puts them back. On MIG devices TimeSlicing sets nothing (as NVIDIA's).
- MPS: the group's devices under one daemon (`nvdp.plugins.dra.mps`, held by the claim's UID; the daemons
  of the capacity shares' are the same `DraMps`); the claim's CDI devices carry the client env and
  mounts with the config's limits (pinned memory keyed by GPU UUID, as NVIDIA's driver keys it).
- A config that cannot be applied is that claim's one-line error; what was applied is undone.
- A GPU shared by capacity (`nvdp.plugins.dra.capacity`) takes no config's sharing: its claims are MPS
  clients of its own daemon already.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from nvdp.base.bounded import loads_json
from nvdp.base.errors import NvdpError
from nvdp.base.files import read_bounded, write_atomic
from nvdp.base.logs import log_event
from nvdp.node.cdi.roots import visible_roots
from nvdp.node.nvml.types import ComputeMode, ComputeModes
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.mps import ClientLimits, DraMps, client_edits
from nvdp.plugins.dra.names import MIG_TYPE
from nvdp.plugins.dra.options import DraSettings
from nvdp.plugins.dra.sharing import TIME_SLICING, ConfigProblem, OpaqueConfig, resolve
from nvdp.plugins.dra.timeslice import NvidiaSmi, SimulatedTimeSlices, TimeSlicer

log = logging.getLogger(__name__)

TIMESLICES_FILE = "timeslices.json"  # in the DRA plugin's directory


class ClaimSharing:
    def __init__(self, plugin_dir: Path, nvml: ComputeModes, mps: DraMps, slicer: TimeSlicer) -> None:
        """`mps`: the node's MPS daemons (the capacity shares' too)."""
        self._file = plugin_dir / TIMESLICES_FILE
        self._nvml = nvml
        self.mps = mps
        self._slicer = slicer
        self._lock = threading.Lock()
        self._sliced: dict[str, str] = self._load()  # GPU UUID -> the claim UID that set its interval
        self._shares: dict[str, dict[str, str]] = {}  # claim UID -> device name -> its sharing, in words

    def apply(
        self,
        ref: ClaimRef,
        configs: Sequence[OpaqueConfig],
        allocated: Sequence[Allocated],
        devices: Mapping[str, DraDevice],
    ) -> dict[str, dict[str, Any]]:
        """Apply the configs that apply; device name -> the CDI edits its containers get (MPS).
        Raises ClaimError, with what was applied undone."""
        if not configs:
            return {}
        groups = resolve(configs, allocated, lambda name: devices[name].type == MIG_TYPE, ref)
        planned = []
        for sharing, results in groups:
            named = list(dict.fromkeys(r.device for r in results))
            if shared := [n for n in named if devices[n].allow_multiple_allocations]:
                raise ClaimError(
                    f"ResourceClaim {ref}: a {sharing.kind}'s sharing cannot apply to {shared[0]}: it is "
                    "shared by capacity (each claim's share is enforced by MPS already)"
                )
            uuids = [devices[name].uuid for name in named]
            limits = None
            if sharing.mps is not None:
                try:
                    pinned = sharing.mps.pinned_memory(uuids)
                except ConfigProblem as problem:
                    raise ClaimError(f"ResourceClaim {ref}: {sharing.kind}: {problem}") from None
                limits = ClientLimits(sharing.mps.thread_percentage, pinned)
            planned.append((sharing, named, uuids, limits))
        edits: dict[str, dict[str, Any]] = {}
        shares: dict[str, str] = {}
        try:
            for sharing, named, uuids, limits in planned:
                if sharing.strategy == TIME_SLICING:
                    for uuid in uuids if sharing.interval is not None else ():
                        self._time_slice(uuid, sharing.interval or "", ref.uid)
                    shares.update(dict.fromkeys(named, f"time-slicing {sharing.interval or ''}".strip()))
                elif limits is not None:
                    daemon = self.mps.ensure_daemon(uuids, ref.uid)
                    edits.update(dict.fromkeys(named, client_edits(daemon, limits)))
                    shares.update({n: _mps_words(limits, u) for n, u in zip(named, uuids, strict=True)})
        except NvdpError as error:
            self.release(ref.uid)
            raise ClaimError(f"ResourceClaim {ref}: {error}") from None
        with self._lock:
            self._shares[ref.uid] = shares
        return edits

    def shares(self) -> dict[str, str]:
        """Device name -> the sharing a prepared claim's config applied to it, in words."""
        with self._lock:
            return {name: words for claim in self._shares.values() for name, words in claim.items()}

    def release(self, uid: str) -> None:
        """Undo what the claim `uid` applied: its GPUs' intervals back to Default, its MPS holds
        released. Failures are logged (the claim is gone either way)."""
        with self._lock:
            self._shares.pop(uid, None)
            mine = [gpu for gpu, holder in self._sliced.items() if holder == uid]
            for gpu in mine:
                try:
                    self._slicer.set_timeslice(gpu, "Default")
                except NvdpError as error:
                    log_event(log, logging.WARNING, "cannot reset the time slice", gpu=gpu, error=str(error))
                del self._sliced[gpu]
            if mine:
                self._save()
        self.mps.release(uid)

    def _time_slice(self, gpu: str, interval: str, uid: str) -> None:
        self._nvml.set_compute_mode(gpu, ComputeMode.DEFAULT)
        self._slicer.set_timeslice(gpu, interval)
        with self._lock:
            self._sliced[gpu] = uid
            self._save()

    def _save(self) -> None:
        try:
            write_atomic(self._file, (json.dumps(self._sliced, sort_keys=True) + "\n").encode())
        except OSError as error:
            log_event(log, logging.WARNING, "cannot write the time-sliced GPUs", error=str(error))

    def _load(self) -> dict[str, str]:
        if not self._file.exists():
            return {}
        try:
            found = loads_json(read_bounded(self._file, 1 << 20), max_bytes=1 << 20)
        except (NvdpError, ValueError) as error:
            log_event(log, logging.WARNING, "unreadable time-sliced GPUs; ignored", error=str(error))
            return {}
        if not isinstance(found, dict):
            return {}
        return {str(gpu): str(uid) for gpu, uid in found.items()}


def node_sharing(settings: DraSettings, nvml: object, environ: Mapping[str, str]) -> ClaimSharing:
    """The DRA plugin's: the node's MPS daemons (`DraMps.for_node`; the driver hands them to the
    capacity shares too), time slices through the driver root's nvidia-smi (recorded instead on a
    simulated node)."""
    modes = cast(ComputeModes, nvml)
    slicer: TimeSlicer = SimulatedTimeSlices()
    if not settings.runtime.nvml.startswith("sim:"):
        flags = settings.config.flags
        here, _ = visible_roots(flags.nvidia_driver_root, flags.dev_root, flags.plugin.container_driver_root)
        slicer = NvidiaSmi.of_root(here, environ)
    return ClaimSharing(settings.plugin_dir, modes, DraMps.for_node(nvml, settings, environ), slicer)


def _mps_words(limits: ClientLimits, uuid: str) -> str:
    threads = limits.active_thread_percentage
    pinned = limits.pinned_memory.get(uuid)
    parts = [
        f"{threads}% of the threads" if threads is not None else "",
        f"{pinned >> 20}M pinned" if pinned else "",
    ]
    return "MPS" + (": " + ", ".join(p for p in parts if p) if any(parts) else "")
