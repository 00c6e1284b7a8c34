"""What the driver root and the dev root hold (the I/O half of spec generation).

Everything is looked up through the root as this process sees it (the container's mount of the
host's driver root, or the root itself when nvdp runs on the host) and reported as paths inside
that root (`/usr/lib64/libcuda.so.550.54.15`); `nvdp.cdi.spec` maps them to host paths.
"""

from __future__ import annotations

import glob
import os

from nvdp.cdi.spec import DriverFiles
from nvdp.nvml.library import LIBRARY_DIRS

# The driver's user-space libraries containers of the `gpu` class get (compute and utility).
DRIVER_LIBRARIES = (
    "libnvidia-ml",
    "libcuda",
    "libcudadebugger",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-opencl",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-gpucomp",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nscq",
    "libnvidia-opticalflow",
)
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
# Device nodes spec generation may name, as globs under the dev root.
DEV_NODE_GLOBS = (
    "/dev/nvidia*",
    "/dev/nvidia-caps/nvidia-cap*",
    "/dev/nvidia-caps-imex-channels/channel*",
    "/dev/infiniband/*",
    "/dev/gdrdrv",
)


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


def scan_driver(root: str, driver_version: str) -> DriverFiles:
    """The libraries of DRIVER_LIBRARIES at `driver_version`, their `.so.1` links, the binaries of
    BINARIES and the GSP firmware of that version, under `root`."""
    libraries: dict[tuple[str, str], None] = {}
    links: dict[tuple[str, str], None] = {}
    for name in DRIVER_LIBRARIES:
        # The first library directory that has it: on merged-/usr systems /lib64 and /usr/lib64
        # are one directory, and one mount per library is enough.
        for directory in LIBRARY_DIRS:
            path = f"/{directory}/{name}.so.{driver_version}"
            found = _regular_file(root, path)
            if found is None:
                continue
            libraries[(path, found)] = None
            target = os.path.basename(path)
            for link in (f"/{directory}/{name}.so.1", f"/{directory}/{name}.so"):
                if name != "libcuda" and link.endswith(".so"):
                    continue  # only libcuda.so is a link the CUDA runtime looks for
                if os.path.islink(inside(root, link)):
                    links[(link, target if link.endswith(".so.1") else f"{name}.so.1")] = None
            break
    binaries = [
        found
        for name in BINARIES
        for found in [next(filter(None, (_regular_file(root, f"{d}/{name}") for d in BINARY_DIRS)), None)]
        if found is not None
    ]
    firmware = sorted(
        "/" + os.path.relpath(p, root).lstrip("/") if root not in ("", "/") else p
        for d in FIRMWARE_DIRS
        for p in glob.glob(inside(root, f"{d}/{driver_version}/*"))
        if os.path.isfile(p)
    )
    return DriverFiles(tuple(libraries), tuple(links), tuple(binaries), tuple(dict.fromkeys(firmware)))


def scan_dev(root: str) -> frozenset[str]:
    """The device nodes of DEV_NODE_GLOBS that exist under `root`, as /dev/... paths."""
    found: set[str] = set()
    for pattern in DEV_NODE_GLOBS:
        for path in glob.glob(inside(root, pattern)):
            if os.path.isdir(path):
                continue
            found.add(path if root in ("", "/") else "/" + os.path.relpath(path, root))
    return frozenset(found)


def _regular_file(root: str, path: str) -> str | None:
    """The file inside `root` that `path` is, following symlinks the way the host would: an absolute
    link target is taken inside the root (a host path seen through the container's mount)."""
    current = path
    for _ in range(40):
        here = inside(root, current)
        if os.path.islink(here):
            target = os.readlink(here)
            current = os.path.normpath(
                target if target.startswith("/") else os.path.join(os.path.dirname(current), target)
            )
            continue
        return current if os.path.isfile(here) else None
    return None
