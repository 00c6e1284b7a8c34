"""`nvdp simulate` with MPS: a simulated node has no MPS binaries, so no control daemon runs. The
simulation writes the ready markers the daemon would write, so the plugin serves the MPS resources
and the Allocate answer shows the MPS env, mounts and limits."""

from __future__ import annotations

from pathlib import Path

from nvdp.base.dirs import make_dirs
from nvdp.base.errors import NvdpError
from nvdp.config import Config
from nvdp.config.model import MPS

from .layout import MpsRoot


def skip_daemon(config: Config) -> str | None:
    """Write the ready markers of every MPS resource; the line to print, or None without MPS."""
    mps = config.sharing.mps
    if config.sharing.strategy != MPS or mps is None or not config.flags.mps_root:
        return None
    root = MpsRoot(Path(config.flags.mps_root))
    try:
        make_dirs(root.shm_dir)
        for entry in mps.resources:
            make_dirs(root.pipe_dir(entry.advertised_name))
            root.marker(entry.advertised_name).touch()
    except OSError as error:
        raise NvdpError(
            f"--mps-root {root.path}: cannot write the MPS ready markers: {error.strerror}"
        ) from error
    return (
        "MPS: the simulated node has no nvidia-cuda-mps-control, so no MPS control daemon is started; "
        f"its ready markers are written under {root.path} instead.\n"
    )
