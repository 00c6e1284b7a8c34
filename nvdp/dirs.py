"""Creating directories with an explicit mode, whatever the process's umask.

`mkdir -p` under umask 000 makes world-writable directories, and in some of nvdp's a stranger's file
would be trusted (a CDI spec's hooks run as root in the container runtime). Every directory nvdp
creates goes through `make_dirs`, parents included; a directory that already exists keeps its mode
(it is not nvdp's to change). The directories, all 0755 (`DIR_MODE`):

- the kubelet's device-plugin directory and its parents (`--kubelet-socket`'s directory;
  `nvdp.kubeletplugin.dir_lock`), created only at start, when missing;
- the CDI spec directory (`--cdi-spec-dir`, default /var/run/cdi; `nvdp.cdi.writer`);
- the MPS root and under it the shm mount point, each resource's pipe and log directories
  (`nvdp.mps.controller`, `nvdp.mps.command`, `nvdp.mps.simulated`);
- the directory of config-manager's `--config-file-dst` (`nvdp.configmanager.files`);
- the kubelet stand-in's plugin directory (`nvdp.kubelet_standin.registration`; tests, `nvdp simulate`);
- the DRA kubelet plugin's socket directories (`plugins_registry`, `plugins/gpu.nvidia.com`) and its
  CDI root (`nvdp.kubeletplugin.socket_server`, `nvdp.dra.claim_specs`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

DIR_MODE = 0o755


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """Create `path` and its missing parents, each with exactly `mode`, as `mkdir -p` does. Raises
    OSError: NotADirectoryError when a file stands where a parent should be, FileExistsError when
    one stands at `path`.

    Each directory is made owner-only first (the umask can only take bits away) and then set to
    `mode`, so no one else can write into it for an instant under a permissive umask."""
    missing: list[Path] = []
    here = Path(os.path.abspath(path))
    while not os.path.lexists(here) and here.parent != here:
        missing.append(here)
        here = here.parent
    if not missing and not here.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(here))
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if directory.is_dir():
                continue  # made by someone else meanwhile: theirs, mode included
            raise
        os.chmod(directory, mode)
