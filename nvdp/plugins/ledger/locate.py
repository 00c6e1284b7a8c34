"""Which GPU a device ID of the kubelet's record stands for (pure).

The kubelet names devices by the IDs the plugin advertised: a GPU or MIG uuid, a replica
`<uuid>::<n>`. An ID the served resources know is located through its `Device`; one they do not know
(a resource changed by a reload since the container got it, or an ID of another plugin's making) by its
uuid among the node's GPUs and MIG devices, or by a GPU index (`3`, MIG `3:1`, either with `::<n>`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvdp.node.gpus.devices import AnnotatedID, Device
from nvdp.node.nvml.types import GpuInfo


@dataclass(frozen=True)
class Located:
    """Where a device ID lives: its physical GPU, the GPU or MIG uuid it gives a container, NVIDIA's
    index (`3`, `3:1`)."""

    gpu_uuid: str
    uuid: str
    index: str

    @classmethod
    def of(cls, device: Device) -> Located:
        return cls(device.gpu_uuid, device.uuid, device.index)


def locate(device_id: str, devices: Mapping[str, Device], gpus: Sequence[GpuInfo]) -> Located | None:
    """Where `device_id` lives, from the resource's `devices` first, else from the node's `gpus`;
    None when neither knows it."""
    known = devices.get(device_id)
    if known is not None:
        return Located.of(known)
    unit = AnnotatedID.parse(device_id).uuid
    for gpu in gpus:
        if unit == gpu.uuid or unit == str(gpu.index):
            return Located(gpu.uuid, gpu.uuid, str(gpu.index))
        for mig in gpu.mig_devices:
            if unit == mig.uuid or unit == f"{gpu.index}:{mig.index}":
                return Located(gpu.uuid, mig.uuid, f"{gpu.index}:{mig.index}")
    return None
