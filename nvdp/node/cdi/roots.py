"""Where this process sees the host's driver root and dev root, and a path inside one of them.

Apart from the scan (`nvdp.node.cdi.scan`) because the device-node gate and the settings need these two
lookups on every plugin's start, the scan only with a CDI strategy.
"""

from __future__ import annotations

import os


def visible_roots(driver_root: str, dev_root: str, container_driver_root: str) -> tuple[str, str]:
    """Where this process sees the host's driver root and dev root: the container's mount of the
    driver root when there is one (as in the chart), else the roots themselves (nvdp on the host).
    A dev root apart from the driver root is looked at directly when it exists here."""
    mounted = os.path.isdir(container_driver_root)
    driver_here = container_driver_root if mounted else driver_root or "/"
    if (dev_root or "/") == (driver_root or "/"):
        return driver_here, driver_here
    return driver_here, dev_root if os.path.isdir(dev_root) or not mounted else container_driver_root


def inside(root: str, path: str) -> str:
    """`path` (absolute, inside the root) as seen from here."""
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))
