"""The simulated NVML backend: a node described by a profile or node file, with fault injection.

It behaves like NVML where nvdp depends on it: calls before init() raise NVML_ERROR_UNINITIALIZED;
events are registered on whole GPUs and carry GPU/compute instance ids for MIG devices; a lost GPU
raises NVML_ERROR_GPU_IS_LOST; event sets are owned by one thread. Faults come from `inject()`,
fed by the $NVDP_SIM_EVENTS file follower (one JSON object per line, `events` checks its shape).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace

from nvdp.base.errors import nvml_error
from nvdp.base.units import MIB
from nvdp.node.nvml.sim.event_set import SimEventSet
from nvdp.node.nvml.sim.events import (
    ECC_EVENTS,
    EVENT_NAMES,
    INSTANCE_MAX,
    PROBE_EVENTS,
    STATE_EVENTS,
    SimEventError,
    decode_event,
)
from nvdp.node.nvml.sim.follower import FileFollower
from nvdp.node.nvml.sim.layout import KeptLayout
from nvdp.node.nvml.sim.mig import MigLayoutError, place, sim_engines
from nvdp.node.nvml.sim.mig_control import SimMigControl
from nvdp.node.nvml.sim.node import SimGpu, SimNode, derived_uuid
from nvdp.node.nvml.types import (
    ComputeMode,
    EventType,
    GpuFabric,
    GpuInfo,
    GpuLayout,
    GpuLink,
    MigDeviceInfo,
    NvmlEvent,
    ProbeResult,
)

logger = logging.getLogger(__name__)

_ECC_TYPES = EventType.SINGLE_BIT_ECC | EventType.DOUBLE_BIT_ECC
_BASE_TYPES = EventType.XID_CRITICAL | EventType.PSTATE | EventType.CLOCK


@dataclass
class _GpuState:
    mig: tuple[MigDeviceInfo, ...] | None  # None: MIG disabled
    lost: bool = False
    hung: bool = False  # enumeration blocks until gpu-restored (a driver stuck on this GPU)
    probe: ProbeResult = ProbeResult()
    created: int = 0  # MIG layouts applied by events: each re-creates the devices, new UUIDs


class SimNvml:
    """NVML over a simulated node. Thread-safe; one optional events-file follower thread."""

    def __init__(self, node: SimNode, events_path: str | None = None) -> None:
        self.node = node
        self.events_path = events_path
        self._lock = threading.Lock()
        self._unhung = threading.Condition(self._lock)  # notified when a GPU stops being hung
        self.compute_modes: dict[str, ComputeMode] = {}  # recorded by set_compute_mode (MPS)
        self._initialized = False
        self._follower: FileFollower | None = None
        self._sets: weakref.WeakSet[SimEventSet] = weakref.WeakSet()
        self._index = {gpu.uuid: gpu.index for gpu in node.gpus}
        self._state = [_GpuState(self._mig_devices(gpu, gpu.mig), gpu.lost) for gpu in node.gpus]
        self._enumerated: set[int] = set()  # GPUs listed with their facts once (real NVML keeps them)
        self._layout = KeptLayout()
        self._faults_logged: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self) -> None:
        with self._lock:
            if self._initialized:
                return
            self._initialized = True
            if self.events_path:
                self._follower = FileFollower(self.events_path, self._on_line)
                self._follower.start()
        logger.info("simulated NVML initialized node=%s gpus=%d", self.node.name, len(self.node.gpus))

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            follower, self._follower = self._follower, None
            sets = list(self._sets)
            self._sets.clear()
        if follower is not None:
            follower.stop()
        for event_set in sets:
            event_set._invalidate()
        logger.info("simulated NVML shut down node=%s", self.node.name)

    # -- queries -----------------------------------------------------------------------------

    def driver_version(self) -> str:
        self._require_init("nvmlSystemGetDriverVersion")
        return self.node.driver_version

    def cuda_driver_version(self) -> str:
        self._require_init("nvmlSystemGetCudaDriverVersion")
        return self.node.cuda_driver_version

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, lost ones included: with their facts once listed while answering; with `fault`
        set and only uuid, index, name, minor and bus id when lost before their first listing."""
        self._require_init("nvmlDeviceGetHandleByIndex")
        with self._lock:
            if any(state.hung for state in self._state):
                logger.info("simulated GPU enumeration blocked by a hung GPU node=%s", self.node.name)
            while any(state.hung for state in self._state):
                self._unhung.wait()
            states = [(state.mig, state.lost) for state in self._state]
            gpus = []
            for gpu, (mig, lost) in zip(self.node.gpus, states, strict=True):
                if lost and gpu.index not in self._enumerated:
                    gpus.append(self._faulty(gpu))
                    continue
                self._enumerated.add(gpu.index)
                gpus.append(
                    GpuInfo(
                        index=gpu.index,
                        uuid=gpu.uuid,
                        name=gpu.name,
                        minor=gpu.minor,
                        memory_bytes=gpu.memory_mib * MIB,
                        compute_capability=gpu.compute_capability,
                        pci_bus_id=gpu.pci_bus_id,
                        numa_node=gpu.numa_node,
                        mig_capable=gpu.mig_capable,
                        mig_enabled=mig is not None,
                        mig_devices=mig or (),
                        pcie_root=self.node.pcie_root(gpu.index),
                    )
                )
        return gpus

    def mig_layout(self) -> dict[str, GpuLayout]:
        """Per GPU its MIG mode and MIG devices only, as `gpus()` would list them now (a GPU lost
        before its first listing: MIG disabled, like its faulty record)."""
        self._require_init("nvmlDeviceGetHandleByIndex")
        with self._lock:
            facts = [(state.mig, state.lost) for state in self._state]
            return self._layout.get(self.node.gpus, facts, self._enumerated)

    def _faulty(self, gpu: SimGpu) -> GpuInfo:
        error = nvml_error("NVML_ERROR_GPU_IS_LOST", "nvmlDeviceGetMemoryInfo", "GPU is lost", gpu.uuid)
        if gpu.index not in self._faults_logged:
            self._faults_logged.add(gpu.index)
            logger.warning(
                "GPU enumeration failed; advertising it Unhealthy gpu=%s index=%d error=%r",
                gpu.uuid,
                gpu.index,
                str(error),
            )
        return GpuInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            minor=gpu.minor,
            memory_bytes=0,
            compute_capability=(0, 0),
            pci_bus_id=gpu.pci_bus_id,
            numa_node=None,
            fault=str(error),
            pcie_root=self.node.pcie_root(gpu.index),
        )

    def link(self, uuid_a: str, uuid_b: str) -> GpuLink:
        call = "nvmlDeviceGetTopologyCommonAncestor"
        self._require_init(call)
        a, b = self._gpu(uuid_a, call), self._gpu(uuid_b, call)
        if a == b:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT", call, "both devices are the same GPU", uuid_a)
        return GpuLink(self.node.nvlinks(a, b), self.node.pcie(a, b))

    def create_event_set(self) -> SimEventSet:
        self._require_init("nvmlEventSetCreate")
        event_set = SimEventSet(self)
        with self._lock:
            self._sets.add(event_set)
        return event_set

    def probe(self, gpu_uuid: str) -> ProbeResult:
        """Memory info + pending retirements + row remapping of a GPU (a MIG uuid probes its parent)."""
        call = "nvmlDeviceGetMemoryInfo"
        self._require_init(call)
        with self._lock:
            parent = self._parent_of_mig(gpu_uuid)
        index = self._gpu(parent.uuid if parent else gpu_uuid, call)
        return self._state[index].probe

    def gpu_fabric(self, gpu_uuid: str) -> GpuFabric | None:
        call = "nvmlDeviceGetGpuFabricInfo"
        self._require_init(call)
        return self.node.fabric.get(self._gpu(gpu_uuid, call))

    # -- fault injection ---------------------------------------------------------------------

    def inject(self, event: Mapping[str, object] | str) -> None:
        """Apply one event (a decoded or JSON events-file line); SimEventError when it cannot be."""
        event = decode_event(event)
        if event.get("event") == "wait-error":
            self._fail_next_waits(event.get("code", "NVML_ERROR_UNKNOWN"))
            return
        with self._lock:
            gpu, mig = self._target(event.get("uuid"))
            if "mig" in event:
                self._set_mig_layout(gpu, mig, event["mig"])
            elif "compute-mode" in event:
                self._change_compute_mode(gpu, mig, event["compute-mode"])
            elif isinstance(xid := event.get("xid"), int):  # range-checked by decode_event
                self._deliver(gpu, mig, EventType.XID_CRITICAL, xid, event)
            else:
                self._apply_event(gpu, mig, event["event"], event)

    def _on_line(self, line: str) -> None:
        text = line.strip()
        if not text or text.startswith("#"):
            return
        try:
            self.inject(text)
        except SimEventError as e:
            reason = str(e) if len(str(e)) <= 160 else str(e)[:157] + "..."  # it may quote the line
            logger.warning(
                "simulated event skipped file=%s reason=%r line=%r", self.events_path, reason, text[:64]
            )

    def _target(self, uuid: object) -> tuple[SimGpu, MigDeviceInfo | None]:
        if not isinstance(uuid, str):
            raise SimEventError(f"uuid: required, a GPU or MIG uuid of this node, got {uuid!r}")
        if uuid in self._index:
            return self.node.gpus[self._index[uuid]], None
        for state, gpu in zip(self._state, self.node.gpus, strict=True):
            for mig in state.mig or ():
                if mig.uuid == uuid:
                    return gpu, mig
        raise SimEventError(f"uuid: no GPU or MIG device {uuid!r} on node {self.node.name}")

    def _apply_event(
        self, gpu: SimGpu, mig: MigDeviceInfo | None, name: object, event: Mapping[str, object]
    ) -> None:
        if isinstance(name, str) and name in ECC_EVENTS:
            self._deliver(gpu, mig, ECC_EVENTS[name], 0, event)
            return
        if name not in STATE_EVENTS:
            raise SimEventError(f"event: unknown {name!r} (accepted: {', '.join(EVENT_NAMES)})")
        if "gi_id" in event or "ci_id" in event:
            raise SimEventError(f"gi_id/ci_id do not apply to {name!r}")
        state = self._state[gpu.index]
        if name == "gpu-lost":
            state.lost = True
        elif name == "gpu-hung":
            state.hung = True
        elif name == "gpu-restored":
            state.lost = state.hung = False
            self._unhung.notify_all()
        elif name == "clear-pending":
            state.probe = ProbeResult()
        else:
            state.probe = replace(state.probe, **PROBE_EVENTS[str(name)])
        logger.info("simulated GPU state change gpu=%s index=%d event=%s", gpu.uuid, gpu.index, name)

    def _deliver(
        self,
        gpu: SimGpu,
        mig: MigDeviceInfo | None,
        event_type: EventType,
        data: int,
        line: Mapping[str, object],
    ) -> None:
        gi_id, ci_id = (mig.gi_id, mig.ci_id) if mig else (None, None)
        for key in ("gi_id", "ci_id"):
            value = line.get(key)
            if value is None:
                continue
            if mig is not None:
                raise SimEventError(f"{key}: the instance comes from the MIG uuid; give the GPU uuid instead")
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INSTANCE_MAX:
                raise SimEventError(f"{key}: must be an integer from 0 to 2**32-2, got {value!r}")
            gi_id, ci_id = (value, ci_id) if key == "gi_id" else (gi_id, value)
        event = NvmlEvent(gpu.uuid, event_type, data, gi_id, ci_id)
        logger.debug(
            "simulated event gpu=%s type=%s data=%d gi=%s ci=%s",
            gpu.uuid,
            event_type.name,
            data,
            gi_id,
            ci_id,
        )
        for event_set in list(self._sets):
            event_set._offer(event)

    def _fail_next_waits(self, code: object) -> None:
        if not isinstance(code, str) or not code.startswith("NVML_ERROR_"):
            raise SimEventError(f"code: must be an NVML error name like 'NVML_ERROR_UNKNOWN', got {code!r}")
        with self._lock:
            sets = list(self._sets)
        for event_set in sets:
            event_set._fail_next_wait(code)

    def _set_mig_layout(self, gpu: SimGpu, mig: MigDeviceInfo | None, layout: object) -> None:
        if mig is not None:
            raise SimEventError("mig: a MIG layout applies to a GPU uuid, not a MIG device")
        if not gpu.mig_capable:
            raise SimEventError(f"mig: GPU {gpu.index} ({gpu.name}) is not MIG capable")
        if layout is not None and not (isinstance(layout, list) and all(isinstance(p, str) for p in layout)):
            raise SimEventError(f"mig: must be null or a list of MIG profile names, got {layout!r}")
        try:
            state = self._state[gpu.index]
            devices = self._mig_devices(gpu, None if layout is None else tuple(layout), state.created + 1)
        except MigLayoutError as e:
            raise SimEventError(f"mig: {e}") from e
        state.mig, state.created = devices, state.created + 1
        logger.info(
            "simulated MIG layout changed gpu=%s index=%d mig=%s",
            gpu.uuid,
            gpu.index,
            "disabled" if devices is None else ",".join(d.profile for d in devices) or "enabled",
        )

    def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        self._require_init("nvmlDeviceGetComputeMode")
        self._gpu(gpu_uuid, "nvmlDeviceGetComputeMode")
        with self._lock:
            return self.compute_modes.get(gpu_uuid, ComputeMode.DEFAULT)

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self._require_init("nvmlDeviceSetComputeMode")
        self._gpu(gpu_uuid, "nvmlDeviceSetComputeMode")
        with self._lock:
            self.compute_modes[gpu_uuid] = ComputeMode(mode)
        logger.info("simulated compute mode set gpu=%s mode=%s", gpu_uuid, ComputeMode(mode).name)

    def mig_control(self) -> SimMigControl:  # making MIG devices: nvdp.node.nvml.sim.mig_control
        return SimMigControl(self)

    def _change_compute_mode(self, gpu: SimGpu, mig: MigDeviceInfo | None, mode: object) -> None:
        """A compute mode changed behind the process's back (nvidia-smi -c, a driver reload)."""
        names = ", ".join(ComputeMode.__members__)
        if mig is not None:
            raise SimEventError("compute-mode: a GPU's setting; name the GPU, not a MIG device")
        if not isinstance(mode, str) or mode not in ComputeMode.__members__:
            raise SimEventError(f"compute-mode: must be one of {names}, got {mode!r}")
        self.compute_modes[gpu.uuid] = ComputeMode[mode]
        logger.info("simulated compute mode changed gpu=%s mode=%s", gpu.uuid, mode)

    # -- helpers -----------------------------------------------------------------------------

    def _require_init(self, call: str) -> None:
        if not self._initialized:
            raise nvml_error("NVML_ERROR_UNINITIALIZED", call, "call init() first")

    def _gpu(self, uuid: str, call: str) -> int:
        """The index of a GPU uuid; NVML's errors for a MIG, unknown or lost one."""
        index = self._index.get(uuid)
        if index is None:
            with self._lock:
                is_mig = self._parent_of_mig(uuid) is not None
            if is_mig:
                raise nvml_error("NVML_ERROR_NOT_SUPPORTED", call, "not supported on a MIG device", uuid)
            raise nvml_error("NVML_ERROR_NOT_FOUND", "nvmlDeviceGetHandleByUUID", "no such device", uuid)
        if self._state[index].lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST", call, "", uuid)
        return index

    def _parent_of_mig(self, uuid: str) -> SimGpu | None:
        pairs = zip(self._state, self.node.gpus, strict=True)
        return next((gpu for state, gpu in pairs if any(m.uuid == uuid for m in state.mig or ())), None)

    def _supported_events(self, gpu_uuid: str) -> EventType:
        index = self._gpu(gpu_uuid, "nvmlDeviceRegisterEvents")
        return _BASE_TYPES | _ECC_TYPES if self.node.gpus[index].ecc else _BASE_TYPES

    @staticmethod
    def _mig_devices(
        gpu: SimGpu, layout: tuple[str, ...] | None, created: int = 0
    ) -> tuple[MigDeviceInfo, ...] | None:
        """The MIG devices of a layout; `created` counts the layouts applied before, so a re-created
        device has a new UUID as on real NVML (the node file's layout: the same UUIDs every start)."""
        if layout is None:
            return None
        suffix = f"/{created}" if created else ""
        return tuple(
            MigDeviceInfo(
                uuid=derived_uuid("MIG", f"{gpu.uuid}/{d.gi_id}/{d.ci_id}{suffix}"),
                index=n,
                gi_id=d.gi_id,
                ci_id=d.ci_id,
                profile=d.profile,
                memory_bytes=d.memory_mib * MIB,
                parent_uuid=gpu.uuid,
                parent_index=gpu.index,
                placement=d.placement,
                engines=sim_engines(d.profile, gpu.compute_capability[0]),
            )
            for n, d in enumerate(place(layout, gpu.mig_geometry))
        )
