"""The MPS control daemons of the GPUs shared by capacity (`nvdp.dra.capacity`), run by the DRA plugin.

- One per GPU, started when its first claim is prepared; the claim is answered once it is ready.
- The daemon is `nvdp mps-control-daemon`'s (`nvdp.mps.controller`): the GPU EXCLUSIVE_PROCESS,
  `nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES naming the GPU, the ready marker, a health
  query every `health_interval`, restarts with backoff; in `<mps root>/gpu.nvidia.com/<GPU uuid>/`.
- A daemon that cannot start fails the claim with what its status file says; the next claim tries again.
- The shares of the claims prepared since the start never exceed a capacity of their GPU.
- Daemons run until the plugin stops (each `quit`, its GPU back to DEFAULT).
- A simulated node without `nvidia-cuda-mps-control` (`nvdp simulate --api dra`) runs none: the ready
  marker is written instead, as `nvdp.mps.simulated` does for the device plugin.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from nvdp.config.model import Dra
from nvdp.dirs import make_dirs
from nvdp.dra.capacity import (
    COMPUTE,
    MEMORY,
    Share,
    capacity_misfits,
    client_edits,
    daemon_name,
    kept_shared,
    mps_root,
    one_gpu,
    parse_quantity,
    share_of,
    shared_by_capacity,
)
from nvdp.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.dra.devices import DraDevice, quantity
from nvdp.dra.options import DraSettings
from nvdp.inventory import dra_sharing
from nvdp.logs import log_event
from nvdp.misfit_report import MisfitReport
from nvdp.mps.controller import MpsController
from nvdp.mps.layout import CONTROL_BINARY, MpsRoot
from nvdp.mps.plan import DaemonPlan, GpuShare
from nvdp.mps.status import read_status
from nvdp.nvml.types import ComputeModes, GpuInfo

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0  # a daemon's start, as a claim waits for it
READY_POLL_S = 0.005
STOP_TIMEOUT_S = 10.0


class CapacityDaemons:
    """`edits(...)` for NodePrepareResources (any thread); `stop()` at the plugin's stop."""

    def __init__(
        self,
        nvml: ComputeModes,
        root: MpsRoot,
        environ: Mapping[str, str],
        *,
        simulated: bool = False,
        ready_timeout: float = READY_TIMEOUT_S,
        health_interval: float = 5.0,
        binary: str = CONTROL_BINARY,
    ) -> None:
        self.root = root
        self._nvml = nvml
        self._environ = dict(environ)
        self._simulated = simulated
        self._ready_timeout = ready_timeout
        self._health_interval = health_interval
        self._binary = binary
        self._lock = threading.Lock()
        self._daemons: dict[str, tuple[MpsController, threading.Thread]] = {}  # GPU uuid ->
        self._stopped = False
        self.shared: frozenset[str] | None = None  # the GPUs shared by capacity, as last settled
        self._held: dict[str, tuple[Share, ...]] = {}  # claim UID -> its shares (since the start)

    @staticmethod
    def for_node(nvml: object, settings: DraSettings, environ: Mapping[str, str]) -> CapacityDaemons:
        """In the settings' MPS root; a simulated node without the control binary on PATH marks its
        daemons ready instead."""
        path = os.pathsep.join(os.get_exec_path(dict(environ)))
        missing = shutil.which(CONTROL_BINARY, path=path) is None
        simulated = settings.runtime.nvml.startswith("sim:") and missing
        root = mps_root(settings.config.flags.mps_root)
        return CapacityDaemons(cast(ComputeModes, nvml), root, environ, simulated=simulated)

    def settle(
        self,
        dra: Dra,
        gpus: Sequence[GpuInfo],
        devices: Sequence[DraDevice],
        held: Collection[str],
        misfits: MisfitReport,
    ) -> list[DraDevice]:
        """`devices` with the GPUs shared by capacity made so: those `dra.consumableCapacity` names
        and those shared before that a prepared claim still `held` (uuids); their misfits told."""
        sharing, told = dra_sharing(dra, gpus)
        before = sharing.capacity if self.shared is None else self.shared  # at start: held claims are shares
        self.shared = kept_shared(sharing.capacity, before, held)
        misfits.update("sharing", (*told, *capacity_misfits(gpus, self.shared)))
        return shared_by_capacity(devices, self.shared)

    def edits(
        self, ref: ClaimRef, allocated: Sequence[Allocated], devices: Mapping[str, DraDevice]
    ) -> tuple[dict[str, dict[str, list[Any]]], tuple[Share, ...]]:
        """The claim's shares and, per shared device, the CDI containerEdits of an MPS client limited
        to them; the GPU's daemon started first (and waited for). Raises ClaimError, also for shares
        past what the claims prepared since the start left of the GPU."""
        claim = str(ref)
        by_device: dict[str, Share] = {}
        for result in allocated:
            device = devices[result.device]
            if not device.allow_multiple_allocations:
                continue
            share = share_of(device, result.consumed_capacity, claim)
            if (before := by_device.get(device.name)) is not None:  # two requests, one device
                share = Share(
                    share.device,
                    share.gpu_uuid,
                    before.memory_bytes + share.memory_bytes,
                    min(100, before.compute + share.compute),
                )
            by_device[device.name] = share
        shares = tuple(by_device.values())
        gpu = one_gpu(shares, claim)
        if gpu is None:
            return {}, ()
        device = devices[shares[0].device]
        self._take(ref.uid, shares, devices, claim)
        try:
            self._ready(gpu, int(device.attributes["index"]["int"]), shares[0], claim)
        except BaseException:
            self.release(ref.uid)
            raise
        log_event(
            log,
            logging.INFO,
            "claim's share",
            claim=claim,
            gpu=gpu,
            shares="; ".join(s.describe() for s in shares),
        )
        return {s.device: client_edits(s, self.root) for s in shares}, shares

    def release(self, uid: str) -> None:
        """The claim is unprepared: its shares are the GPUs' again."""
        with self._lock:
            self._held.pop(uid, None)

    def _take(self, uid: str, shares: Sequence[Share], devices: Mapping[str, DraDevice], claim: str) -> None:
        """Hold the claim's shares, if what the other prepared claims hold of each GPU leaves room."""
        with self._lock:
            for share in shares:
                others = [
                    s for u, held in self._held.items() if u != uid for s in held if s.device == share.device
                ]
                total = {
                    name: parse_quantity(c["value"]) for name, c in devices[share.device].capacity.items()
                }
                for name, asked, used in (
                    (MEMORY, share.memory_bytes, sum(s.memory_bytes for s in others)),
                    (COMPUTE, share.compute, sum(s.compute for s in others)),
                ):
                    if asked and used + asked > total.get(name, 0):
                        left = quantity(max(0, total.get(name, 0) - used))["value"]
                        raise ClaimError(
                            f"ResourceClaim {claim}: {share.device} has {name} {left} left by the claims "
                            f"prepared on it, not the {quantity(asked)['value']} the claim consumes"
                        )
            self._held[uid] = tuple(shares)

    def _ready(self, gpu: str, index: int, share: Share, claim: str) -> None:
        name = daemon_name(gpu)
        with self._lock:
            if self._stopped:
                raise ClaimError(f"ResourceClaim {claim}: the plugin is stopping")
            if self.root.marker(name).exists() and (gpu in self._daemons or self._simulated):
                return
            if self._simulated:
                make_dirs(self.root.pipe_dir(name))
                make_dirs(self.root.shm_dir)
                self.root.marker(name).touch()
                log_event(
                    log,
                    logging.INFO,
                    "simulated node: no MPS control daemon started; its ready marker written",
                    gpu=gpu,
                    marker=str(self.root.marker(name)),
                )
                return
            if gpu not in self._daemons:
                self._start(gpu, index, name)
        deadline = time.monotonic() + self._ready_timeout
        while not self.root.marker(name).exists():
            why = read_status(self.root.status(name))
            if why or time.monotonic() >= deadline:
                reason = why or f"not ready within {self._ready_timeout:g}s"
                raise ClaimError(
                    f"ResourceClaim {claim}: the MPS control daemon of {share.device} ({gpu}) is not "
                    f"ready: {reason}"
                )
            time.sleep(READY_POLL_S)

    def _start(self, gpu: str, index: int, name: str) -> None:
        self.root.marker(name).unlink(missing_ok=True)  # an earlier run's: not this daemon's
        plan = {name: DaemonPlan(name, (GpuShare(gpu, index, 0, 1),))}
        controller = MpsController(
            self._nvml,
            self.root,
            lambda: plan,
            {**self._environ, "CUDA_VISIBLE_DEVICES": gpu},
            health_interval=self._health_interval,
            binary=self._binary,
        )
        thread = threading.Thread(target=controller.run, args=(plan,), name=f"mps-{gpu}", daemon=True)
        self._daemons[gpu] = (controller, thread)
        log_event(log, logging.INFO, "starting the MPS control daemon of a GPU shared by capacity", gpu=gpu)
        thread.start()

    def stop(self) -> None:
        """Every daemon quit, its GPU back to DEFAULT (bounded: a hung daemon is killed)."""
        with self._lock:
            self._stopped = True
            daemons = list(self._daemons.values())
            self._daemons.clear()
        for controller, _ in daemons:
            controller.request_stop()
        for controller, thread in daemons:
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                controller.abandon()
