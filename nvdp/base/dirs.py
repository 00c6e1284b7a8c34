"""Creating directories with an explicit mode (`DIR_MODE`, 0755), whatever the process's umask.

- Every directory nvdp creates goes through `make_dirs`, parents included: under umask 000 a
  stranger's file could land in one and be trusted (a CDI spec's hooks run as root).
- A directory that already exists keeps its mode (it is not nvdp's to change).
- Users: the kubelet's device-plugin directory, only at start (`nvdp.plugins.kubeletplugin.dir_lock`); the
  CDI spec directory (`nvdp.node.cdi.writer`); the MPS root, shm mount point, pipe and log directories
  (`nvdp.node.mps.controller`, `nvdp.node.mps.command`, `nvdp.node.mps.simulated`); config-manager's
  `--config-file-dst` directory (`nvdp.side.configmanager.files`); the kubelet stand-in's plugin directory
  (`nvdp.sim.kubelet.registration`); the DRA plugin's socket directories and CDI root
  (`nvdp.plugins.kubeletplugin.socket_server`, `nvdp.plugins.dra.claim_specs`).
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
