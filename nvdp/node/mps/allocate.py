"""What Allocate adds for an MPS resource (pure).

NVIDIA's part: CUDA_MPS_PIPE_DIRECTORY names the resource's pipe directory, which is mounted at the
same path, and `<root>/shm` is mounted at /dev/shm. nvdp's part: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE sized to the replicas this container received, out of each GPU's
own replica count.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nvdp.api import pb
from nvdp.config.model import MPS
from nvdp.node.gpus.devices import Device
from nvdp.node.gpus.resources import Resource

from .layout import CONTAINER_SHM, PIPE_ENV, MpsRoot
from .plan import container_limit_envs


def add_mps(
    container: pb.ContainerAllocateResponse, resource: Resource, devices: Sequence[Device], root: str | None
) -> None:
    if resource.sharing != MPS or not root:
        return
    layout = MpsRoot(Path(root))
    pipe = str(layout.pipe_dir(resource.name))
    container.envs[PIPE_ENV] = pipe
    container.mounts.add(container_path=pipe, host_path=pipe)
    container.mounts.add(container_path=CONTAINER_SHM, host_path=str(layout.shm_dir))
    for key, value in container_limit_envs(devices, resource.replicas_of).items():
        container.envs[key] = value
