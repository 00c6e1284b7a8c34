"""Device records the plugin advertises, built from NVML facts, and device-ID handling (pure).

A `Device` is one unit the kubelet can hand out: a whole GPU, a MIG device, or a replica of
either when the GPU is shared (its ID is then `<uuid>::<n>`, as in NVIDIA's plugin). `gpu_device` and
`mig_device` build the records of one GPU / MIG device with the device nodes a container needs (a MIG
device's capability nodes from /proc/driver/nvidia-caps/mig-minors, `parse_mig_minors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo

REPLICA_SEPARATOR = "::"
# The driver's control nodes, offered to every container that gets a GPU when present.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# The MIG capability minors (`parse_mig_minors`); procfs shows the host's driver state in a container too.
MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
_MAX_NAMED_IDS = 10
_MAX_ID_CHARS = 80
# /proc/driver/nvidia-caps/mig-minors lists `gpu<minor>/gi<g>/access <n>` and
# `gpu<minor>/gi<g>/ci<c>/access <n>`; the driver lays them out as below when the file is absent.
_CAPS_PER_GPU = 15 * 9


def format_ids(ids: Sequence[str]) -> str:
    """IDs for an error message: at most 10, each cut to 80 characters, so a request with thousands
    of bad IDs still gets an answer that fits in gRPC's status trailer."""
    named = ", ".join(
        i if len(i) <= _MAX_ID_CHARS else i[: _MAX_ID_CHARS - 3] + "..." for i in ids[:_MAX_NAMED_IDS]
    )
    more = len(ids) - _MAX_NAMED_IDS
    return f"{named} (and {more} more)" if more > 0 else named


@dataclass(frozen=True)
class AnnotatedID:
    """A device ID, possibly annotated with a replica number: `GPU-abc::3`."""

    uuid: str
    replica: int | None = None

    @classmethod
    def parse(cls, device_id: str) -> AnnotatedID:
        uuid, sep, rest = device_id.partition(REPLICA_SEPARATOR)
        if not sep:
            return cls(device_id)
        if not rest.isdigit():
            return cls(device_id)
        return cls(uuid, int(rest))

    def __str__(self) -> str:
        if self.replica is None:
            return self.uuid
        return f"{self.uuid}{REPLICA_SEPARATOR}{self.replica}"


@dataclass(frozen=True)
class Device:
    """One allocatable device of a resource."""

    id: str  # what the kubelet sees: the uuid, or uuid::n for a replica
    uuid: str  # the GPU or MIG uuid a container gets
    index: str  # "3" for GPU 3, "3:1" for MIG device 1 of GPU 3 (NVIDIA's index format)
    gpu_uuid: str  # the physical GPU (the uuid itself for a whole GPU)
    gpu_index: int
    numa_node: int | None
    paths: tuple[str, ...]  # host device nodes the container needs, e.g. ("/dev/nvidia3",)
    memory_bytes: int
    mig: MigDeviceInfo | None = None
    replica: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig is not None

    @property
    def order(self) -> tuple[int, int, int]:
        """The sort key of advertisement and answers: by GPU, then MIG device, then replica."""
        mig = self.mig.index if self.mig is not None else -1
        return (self.gpu_index, mig, self.replica if self.replica is not None else -1)


class DeviceSet(Mapping[str, Device]):
    """Devices of one resource keyed by ID, in advertisement order."""

    def __init__(self, devices: Iterable[Device]) -> None:
        self._by_id: dict[str, Device] = {}
        for device in devices:
            if device.id in self._by_id:
                raise ValueError(f"duplicate device id {device.id}")
            self._by_id[device.id] = device

    def __getitem__(self, device_id: str) -> Device:
        return self._by_id[device_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def unknown(self, ids: Iterable[str]) -> list[str]:
        """The IDs in `ids` that are not in this set, in order."""
        return [i for i in ids if i not in self._by_id]

    def with_uuid(self, uuid: str) -> list[Device]:
        """Every device (replicas included) whose underlying GPU or MIG uuid is `uuid`."""
        return [d for d in self._by_id.values() if d.uuid == uuid]


def device_names(devices: Sequence[Device]) -> str:
    """Devices in words: `GPUs 0, 1 and MIG device 3:0`."""
    whole = [d.index for d in devices if not d.is_mig]
    migs = [d.index for d in devices if d.is_mig]
    parts = []
    if whole:
        parts.append(("GPU " if len(whole) == 1 else "GPUs ") + ", ".join(whole))
    if migs:
        parts.append(("MIG device " if len(migs) == 1 else "MIG devices ") + ", ".join(migs))
    return " and ".join(parts)


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse /proc/driver/nvidia-caps/mig-minors into {"gpu0/gi1/ci0/access": 13, ...}."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            table[parts[0]] = int(parts[1])
    return table


def mig_cap_paths(parent_minor: int, mig: MigDeviceInfo, minors: Mapping[str, int] | None) -> list[str]:
    gi_key = f"gpu{parent_minor}/gi{mig.gi_id}/access"
    ci_key = f"gpu{parent_minor}/gi{mig.gi_id}/ci{mig.ci_id}/access"
    if minors and gi_key in minors and ci_key in minors:
        gi_minor, ci_minor = minors[gi_key], minors[ci_key]
    else:
        gi_minor = 3 + parent_minor * _CAPS_PER_GPU + mig.gi_id * 9
        ci_minor = gi_minor + 1 + mig.ci_id
    return [f"/dev/nvidia-caps/nvidia-cap{gi_minor}", f"/dev/nvidia-caps/nvidia-cap{ci_minor}"]


def gpu_device(gpu: GpuInfo) -> Device:
    return Device(
        id=gpu.uuid,
        uuid=gpu.uuid,
        index=str(gpu.index),
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        numa_node=gpu.numa_node,
        paths=(f"/dev/nvidia{gpu.minor}",),
        memory_bytes=gpu.memory_bytes,
    )


def mig_device(gpu: GpuInfo, mig: MigDeviceInfo, minors: Mapping[str, int] | None) -> Device:
    return Device(
        id=mig.uuid,
        uuid=mig.uuid,
        index=f"{gpu.index}:{mig.index}",
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        numa_node=gpu.numa_node,
        paths=(f"/dev/nvidia{gpu.minor}", *mig_cap_paths(gpu.minor, mig, minors)),
        memory_bytes=mig.memory_bytes,
        mig=mig,
    )
