"""Named builders for what the tests feed the code: GPUs, MIG devices, advertised devices and resources
(as NVIDIA's internal/resource/testing has NewFullGPU and NewMigDevice), the GPUs of a built-in
simulated node and the events fed to it. Each builder gives a plausible A100 node part; a test names
only the facts it is about."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from nvdp.node.gpus.devices import AnnotatedID, Device, DeviceSet, gpu_device, mig_device
from nvdp.node.gpus.resources import Resource
from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo
from testkit.nodes import append_sim_event as append_sim_event
from testkit.nodes import sim_gpus as sim_gpus

GIB = 1 << 30
A100 = "NVIDIA A100-SXM4-40GB"


def full_gpu(
    index: int = 0,
    *,
    uuid: str | None = None,
    name: str = A100,
    memory_bytes: int = 40 * GIB,
    compute_capability: tuple[int, int] = (8, 0),
    numa_node: int | None = 0,
    mig_capable: bool = True,
) -> GpuInfo:
    """A whole GPU, MIG disabled: `GPU-<index>` at /dev/nvidia<index>, an A100 40GB unless told."""
    return GpuInfo(
        index=index,
        uuid=uuid or f"GPU-{index}",
        name=name,
        minor=index,
        memory_bytes=memory_bytes,
        compute_capability=compute_capability,
        pci_bus_id=f"00000000:{index + 7:02x}:00.0",
        numa_node=numa_node,
        mig_capable=mig_capable,
    )


def mig_enabled_gpu(index: int = 0, *migs: str | MigDeviceInfo, uuid: str | None = None) -> GpuInfo:
    """`full_gpu(index)` with MIG enabled and one MIG device per profile in `migs`, in order, or the
    MIG devices given (made this GPU's); no `migs`: MIG enabled, no MIG device yet."""
    gpu = full_gpu(index, uuid=uuid)
    devices = tuple(
        dataclasses.replace(m, parent_uuid=gpu.uuid, parent_index=gpu.index)
        if isinstance(m, MigDeviceInfo)
        else mig_device_info(k, m, parent=gpu)
        for k, m in enumerate(migs)
    )
    return dataclasses.replace(gpu, mig_enabled=True, mig_devices=devices)


def mig_device_info(
    index: int = 0,
    profile: str = "1g.5gb",
    *,
    parent: GpuInfo | None = None,
    uuid: str | None = None,
    gi_id: int | None = None,
    ci_id: int = 0,
) -> MigDeviceInfo:
    """MIG device `index` of `parent` (GPU 0 unless told): `MIG-<gpu>-<index>-<profile>`, GPU instance
    7 + index (where an A100's 1g.5gb instances start), the memory its profile names."""
    gpu = parent or full_gpu(0)
    return MigDeviceInfo(
        uuid=uuid or f"MIG-{gpu.index}-{index}-{profile}",
        index=index,
        gi_id=7 + index if gi_id is None else gi_id,
        ci_id=ci_id,
        profile=profile,
        memory_bytes=profile_memory(profile),
        parent_uuid=gpu.uuid,
        parent_index=gpu.index,
    )


def profile_memory(profile: str) -> int:
    """The memory a MIG profile names: 5 GiB for `1g.5gb`, `1g.5gb+me`, `1c.3g.20gb`..."""
    found = re.search(r"(\d+)gb", profile)
    assert found, f"no memory in MIG profile {profile}"
    return int(found.group(1)) * GIB


def with_facts(gpu: GpuInfo, **facts: object) -> GpuInfo:
    """`gpu` with other facts (compute capability, index, uuid...), its MIG devices kept."""
    return dataclasses.replace(gpu, **facts)  # type: ignore[arg-type]


def device(gpu: GpuInfo, mig: MigDeviceInfo | None = None, *, replica: int | None = None) -> Device:
    """The device the plugin advertises for `gpu` (or for `mig`, made a MIG device of `gpu`), as
    nvdp.node.gpus.devices builds it, or its replica `replica` (ID `<uuid>::<replica>`)."""
    if mig is None:
        built = gpu_device(gpu)
    else:
        built = mig_device(gpu, dataclasses.replace(mig, parent_uuid=gpu.uuid, parent_index=gpu.index), None)
    if replica is None:
        return built
    return dataclasses.replace(built, id=str(AnnotatedID(built.uuid, replica)), replica=replica)


def replicas(gpu: GpuInfo, count: int, mig: MigDeviceInfo | None = None) -> list[Device]:
    """Replicas 0..count-1 of the device of `gpu` (or of its MIG device `mig`)."""
    return [device(gpu, mig, replica=n) for n in range(count)]


def resource(name: str, devices: Iterable[Device] = ()) -> Resource:
    """A served resource `name` of `devices` (none by default), whole: no sharing."""
    return Resource(name, DeviceSet(devices))
