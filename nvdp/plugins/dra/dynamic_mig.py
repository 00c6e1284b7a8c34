"""MIG made on demand (`dra.dynamicMig`): the GPUs named there are published as partitionable devices
(`nvdp.plugins.dra.mig_partitions`); a claim's placement becomes a MIG device at prepare, destroyed at
unprepare.

- Prepare makes through NVML (`MigControl`) a GPU instance at the placement and one compute
  instance filling it; the claim's CDI spec names it as a static MIG device's would.
- A placement NVML refuses (NVML_ERROR_INSUFFICIENT_RESOURCES) fails that claim only; what it made
  already is destroyed. MIG mode is never changed.
- What was made is checkpointed with the claim (`MadeMig`), so a restarted plugin destroys it at
  unprepare; an unclaimed MIG device at the allocated placement is taken over by the claim.
- MIG devices no claim made stay; their slices leave the counters, one WARNING names them
  (`reason=MigDevicesNotClaimed`). A made device is registered under the placements' lock, so the
  rescan never takes it for a foreign one.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nvdp.base.errors import NvmlError
from nvdp.base.logs import log_event
from nvdp.config.model import Dra
from nvdp.node.gpus.inventory import dra_sharing
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.nvml.types import GpuInfo, GpuLayout, MigControl, MigDeviceInfo, MigProfileInfo
from nvdp.plugins.dra.checkpoint import MadeMig
from nvdp.plugins.dra.claims import ClaimError
from nvdp.plugins.dra.devices import DraDevice, DriverFacts, _common, _mig
from nvdp.plugins.dra.mig_partitions import partitions

log = logging.getLogger(__name__)

_GONE_KEPT = 1024  # destroyed MIG uuids remembered (an enumeration from before may still list them)


@dataclass(frozen=True)
class Partitioned:
    """What dynamic MIG publishes: the GPUs it serves, their placement devices, its misfits."""

    gpus: frozenset[str]
    devices: list[DraDevice]
    misfits: tuple[Misfit, ...]


def mig_control_of(nvml: object) -> MigControl | None:
    """The backend's MIG control (`mig_control()`), or None where it has none."""
    make = getattr(nvml, "mig_control", None)
    return make() if callable(make) else None


class DynamicMig:
    """`partitioned()` at each enumeration; `make` / `remove` for the claim preparer (any thread)."""

    def __init__(self, control: MigControl | None, layout: Callable[[], Mapping[str, GpuLayout]]) -> None:
        self._control = control
        self._layout = layout  # NVML's cheap layout query: is a MIG device still there
        self._lock = threading.Lock()
        self._ours: dict[str, MadeMig] = {}  # MIG uuid -> what a claim made
        self._gone: deque[str] = deque(maxlen=_GONE_KEPT)
        self._profiles: dict[str, tuple[MigProfileInfo, ...]] = {}  # GPU uuid -> its profiles
        self._gpus: dict[str, GpuInfo] = {}
        self._facts = DriverFacts("", "")
        self._minors: Mapping[str, int] | None = None

    def adopt(self, made: Iterable[MadeMig]) -> None:
        """The MIG devices the checkpoint says claims made (at start)."""
        with self._lock:
            self._ours.update({m.uuid: m for m in made})

    def partitioned(
        self, dra: Dra, gpus: Sequence[GpuInfo], facts: DriverFacts, minors: Mapping[str, int] | None
    ) -> Partitioned:
        """The placement devices of the GPUs `dra.dynamicMig` names (of the DRA driver's, MIG mode on)."""
        sharing, misfits = dra_sharing(dra, gpus)
        named = [g for g in gpus if g.uuid in sharing.dynamic_mig]
        devices: list[DraDevice] = []
        served: set[str] = set()
        foreign_by_gpu: list[tuple[GpuInfo, list[MigDeviceInfo]]] = []
        unreadable: list[Misfit] = []
        with self._lock:
            self._facts, self._minors = facts, minors
            self._gpus = {g.uuid: g for g in gpus}
            for gpu in named:
                profiles = self._profiles_of(gpu, unreadable)
                if not profiles:
                    continue
                foreign = [
                    m for m in gpu.mig_devices if m.uuid not in self._ours and m.uuid not in self._gone
                ]
                devices += partitions(gpu, profiles, facts, foreign)
                served.add(gpu.uuid)
                if foreign:
                    foreign_by_gpu.append((gpu, foreign))
        return Partitioned(
            frozenset(served), devices, (*misfits, *unreadable, *_foreign_misfit(foreign_by_gpu))
        )

    def _profiles_of(self, gpu: GpuInfo, misfits: list[Misfit]) -> tuple[MigProfileInfo, ...]:
        if gpu.uuid not in self._profiles:
            if self._control is None:
                why = "this NVML backend cannot make MIG devices"
                misfits.append(Misfit("DynamicMigUnavailable", f"GPU {gpu.index}", f"dra.dynamicMig: {why}"))
                return ()
            try:
                self._profiles[gpu.uuid] = self._control.mig_profiles(gpu.uuid)
            except NvmlError as error:
                message = (
                    f"dra.dynamicMig: GPU {gpu.index}: cannot read its MIG profiles ({error}); "
                    "served as static MIG"
                )
                misfits.append(Misfit("DynamicMigUnavailable", f"GPU {gpu.index}", message))
                return ()
        return self._profiles[gpu.uuid]

    # ---- nvdp.plugins.dra.prepare.MigMaker ----------------------------------------------------------------

    def make(
        self, uid: str, devices: dict[str, DraDevice]
    ) -> tuple[dict[str, DraDevice], tuple[MadeMig, ...]]:
        out, made = dict(devices), list[MadeMig]()
        for name, device in devices.items():
            if device.placement is None:
                continue
            try:
                mig, record = self._make_one(name, device)
            except ClaimError:
                if made and (undone := self.remove(made)):
                    log_event(log, logging.WARNING, "MIG devices left after a failed prepare", error=undone)
                raise
            made.append(record)
            with self._lock:
                gpu = self._gpus[device.gpu_uuid]
                out[name] = _mig(gpu, mig, _common(gpu, self._facts), self._minors)
            log_event(
                log,
                logging.INFO,
                "MIG device made",
                claim_uid=uid,
                device=name,
                gpu=device.gpu_uuid,
                gi=mig.gi_id,
                uuid=mig.uuid,
            )
        return out, tuple(made)

    def _make_one(self, name: str, device: DraDevice) -> tuple[MigDeviceInfo, MadeMig]:
        where = device.placement
        assert where is not None
        with self._lock:
            gpu = self._gpus.get(device.gpu_uuid)
            if gpu is None or self._control is None:
                raise ClaimError(f"device {name}: its GPU {device.gpu_uuid} is not on this node (any more)")
            left = None
            try:
                left = next((m for m in gpu.mig_devices if m.placement == where and self._unclaimed(m)), None)
                mig = left or self._control.create_mig_device(gpu.uuid, where)
            except NvmlError as error:
                raise ClaimError(
                    f"device {name}: NVML refused a {_profile(device)} GPU instance at memory slices "
                    f"{where.start}-{where.start + where.size - 1} of GPU {gpu.index}: {error}"
                ) from error
            record = MadeMig(gpu.uuid, mig.gi_id, mig.uuid, name)
            self._ours[mig.uuid] = record
        if left is not None:
            log_event(log, logging.WARNING, "MIG device taken over by a claim", device=name, uuid=mig.uuid)
        return mig, record

    def remove(self, made: Sequence[MadeMig]) -> str:
        problems = []
        for record in made:
            with self._lock:
                try:
                    if self._control is not None and self._present(record):
                        self._control.destroy_mig_device(record.gpu_uuid, record.gi_id)
                except NvmlError as error:
                    problems.append(f"cannot destroy MIG device {record.uuid} ({record.device}): {error}")
                    continue
                self._ours.pop(record.uuid, None)
                self._gone.append(record.uuid)
            log_event(log, logging.INFO, "MIG device destroyed", device=record.device, uuid=record.uuid)
        return "; ".join(problems)

    def _unclaimed(self, mig: MigDeviceInfo) -> bool:
        """A MIG device no claim made that is still there (the enumeration may be older)."""
        if mig.uuid in self._ours or mig.uuid in self._gone:
            return False
        layout = self._layout().get(mig.parent_uuid)
        return layout is not None and mig.uuid in layout.mig_uuids

    def _present(self, record: MadeMig) -> bool:
        """Whether the MIG device is still there (a GPU instance of that id made again by someone
        after ours went is not destroyed)."""
        layout = self._layout().get(record.gpu_uuid)
        return layout is not None and record.uuid in layout.mig_uuids


def _profile(device: DraDevice) -> str:
    return str(device.attributes.get("profile", {}).get("string", "MIG"))


def _foreign_misfit(found: Sequence[tuple[GpuInfo, Sequence[MigDeviceInfo]]]) -> tuple[Misfit, ...]:
    if not found:
        return ()
    listed = "; ".join(
        f"GPU {gpu.index}: " + ", ".join(f"{m.uuid} ({m.profile})" for m in migs) for gpu, migs in found
    )
    subject = ",".join(f"GPU {gpu.index}" for gpu, _ in found)
    message = (
        f"dra.dynamicMig: MIG devices no claim made are left in place, their memory slices taken out "
        f"of the counters: {listed}"
    )
    return (Misfit("MigDevicesNotClaimed", subject, message),)
