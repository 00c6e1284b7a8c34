"""What spec generation found on a node (pure data): the driver's files under the driver root and
the device nodes under the dev root, as paths inside those roots (`nvdp.node.cdi.scan` finds them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevNode:
    """What stat says of a device node under the dev root (NVIDIA's spec carries these)."""

    major: int
    minor: int
    mode: int  # permission bits: st_mode without the file type, as the spec's fileMode
    gid: int
    char: bool  # a character device (else a block device)


@dataclass(frozen=True)
class DriverFiles:
    """The driver's files found under a root, as paths inside it."""

    version: str = ""  # the driver version the libraries were looked up at (NVML's)
    # (path in the container, the file it is inside the root): the same unless a symlink led there;
    # the libraries named with `version`, then the legacy ones beside them
    libraries: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (target, link path): libcuda.so.550.54.15 <- libcuda.so.1
    explicit_libraries: tuple[tuple[str, str], ...] = ()  # with `enable-explicit-driver-libraries`
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    ipc_sockets: tuple[str, ...] = ()  # nvidia-persistenced's and nvidia-fabricmanager's

    @property
    def library_dirs(self) -> tuple[str, ...]:
        """The directories of the libraries named with the driver version (`NVIDIA_CTK_LIBCUDA_DIR`)."""
        suffix = f".so.{self.version}"
        return tuple(dict.fromkeys(os.path.dirname(p) for p, _ in self.libraries if p.endswith(suffix)))


@dataclass(frozen=True)
class NodeFiles:
    """What spec generation found on the node (see nvdp.node.cdi.scan)."""

    driver: DriverFiles = field(default_factory=DriverFiles)
    # /dev/... paths present under the dev root; None for one that is not a device node
    dev_nodes: Mapping[str, DevNode | None] = field(default_factory=dict)
