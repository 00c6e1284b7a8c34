"""Facts read from this node's filesystem for the supervisor: which control device nodes exist and
the MIG capability minors in procfs. The pure code (responses, resources) gets them as plain data."""

from __future__ import annotations

import os
from pathlib import Path

from nvdp.node.gpus.devices import CONTROL_DEVICES, MIG_MINORS_FILE, parse_mig_minors
from nvdp.plugins.deviceplugin.responses import host_path


def present_control_devices(dev_root: str) -> tuple[str, ...]:
    """The control device nodes that exist under dev_root (read once when a server starts)."""
    return tuple(p for p in CONTROL_DEVICES if os.path.exists(host_path(dev_root, p)))


def visible_dev_root(dev_root: str, container_driver_root: str) -> str:
    """Where the host's device nodes can be seen from this process: the host root itself when
    it is "/" (or we run on the host), else the driver root mounted into the container."""
    if dev_root not in ("", "/") and not os.path.isdir(dev_root):
        if os.path.isdir(container_driver_root):
            return container_driver_root
    return dev_root


class RealHostFacts:
    """The supervisor's `HostFacts`, read from the real filesystem."""

    def __init__(self, mig_minors_file: Path = MIG_MINORS_FILE) -> None:
        self._mig_minors_file = mig_minors_file

    def control_devices(self, dev_root: str, container_driver_root: str) -> tuple[str, ...]:
        return present_control_devices(visible_dev_root(dev_root, container_driver_root))

    def mig_minors(self) -> dict[str, int] | None:
        try:
            return parse_mig_minors(self._mig_minors_file.read_text())
        except OSError:
            return None
