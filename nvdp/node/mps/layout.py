"""Paths under the MPS root, shared by the control daemon and the plugin.

`<root>/<resource>/pipe` and `<root>/<resource>/log` are the daemon's CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY, `<root>/<resource>/.started` says the daemon is up with its limits set,
`<root>/<resource>/.status` says why it is not (`nvdp.node.mps.status`), and `<root>/shm` is the tmpfs
that containers get as /dev/shm. `<resource>` is the advertised name
(`nvidia.com/gpu`), so the path nests one level (NVIDIA's layout). The chart mounts the host's root
at the same path in both containers, so a path here is also the host path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONTROL_BINARY = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
PINNED_MEM_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CONTAINER_SHM = "/dev/shm"
MARKER = ".started"
STATUS = ".status"


@dataclass(frozen=True)
class MpsRoot:
    path: Path

    def resource_dir(self, resource: str) -> Path:
        return self.path / resource

    def pipe_dir(self, resource: str) -> Path:
        return self.resource_dir(resource) / "pipe"

    def log_dir(self, resource: str) -> Path:
        return self.resource_dir(resource) / "log"

    def marker(self, resource: str) -> Path:
        return self.resource_dir(resource) / MARKER

    def status(self, resource: str) -> Path:
        return self.resource_dir(resource) / STATUS

    @property
    def shm_dir(self) -> Path:
        return self.path / "shm"
