"""Find libnvidia-ml.so.1 the way NVIDIA's device plugin does, and hand it to pynvml.

Order: the container driver root (`--driver-root-ctr-path`, where the chart mounts the driver), then
the driver root (`--nvidia-driver-root`), each under the usual library directories; then the plain
soname, i.e. the dynamic loader's default search (LD_LIBRARY_PATH, the ldconfig cache, what the
container runtime injected). A root of "/" (or empty) goes straight to the default search. When
nothing loads, the error names every path tried.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nvdp.base.errors import NvmlLibraryNotFound

logger = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
# Where driver installs put their libraries, relative to a driver root (NVIDIA's list, then usr/lib):
# libnvidia-ml here, and the libraries a CDI spec mounts (nvdp.node.cdi.scan).
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "glibc/lib",
    "usr/lib",
)
DEFAULT_SEARCH = f"{LIBRARY} (default search: LD_LIBRARY_PATH, ldconfig cache)"


def library_candidates(roots: Iterable[str | None]) -> list[str]:
    """The library paths to try, in order, under each root that is not "/" (duplicates once)."""
    paths: list[str] = []
    for root in roots:
        if not root or os.path.normpath(root) == "/":
            continue
        for directory in LIBRARY_DIRS:
            path = os.path.join(root, directory, LIBRARY)
            if path not in paths:
                paths.append(path)
    return paths


@dataclass
class LibraryLookup:
    """The outcome of a lookup: the path loaded (None: left to the default search) and what was tried."""

    path: str | None = None
    tried: list[str] = field(default_factory=list)

    def not_found(self, detail: str = "") -> NvmlLibraryNotFound:
        """The error for a default search that failed too, naming every path tried."""
        tried = ", ".join([*self.tried, DEFAULT_SEARCH])
        extra = f"; {detail}" if detail else ""
        return NvmlLibraryNotFound(
            "NVML_ERROR_LIBRARY_NOT_FOUND",
            "load " + LIBRARY,
            f"tried {tried}{extra} (set --nvidia-driver-root / --driver-root-ctr-path?)",
        )


def preload(pynvml: Any, roots: Iterable[str | None], load: Callable[[str], object]) -> LibraryLookup:
    """Load the first library found under the roots and make pynvml use it; else leave pynvml to
    the default search. Paths that are missing or fail to load are recorded, never raised."""
    lookup = LibraryLookup()
    for path in library_candidates(roots):
        if not os.path.exists(path):
            lookup.tried.append(path)
            continue
        try:
            library = load(path)
        except OSError as e:
            lookup.tried.append(f"{path} ({e})")
            logger.warning("NVML library failed to load; trying the next path=%s error=%r", path, str(e))
            continue
        _hand_to_pynvml(pynvml, library, path)
        lookup.path = path
        return lookup
    if lookup.tried:
        logger.info(
            "NVML library not under the driver roots; using the default search tried=%d", len(lookup.tried)
        )
    return lookup


def _hand_to_pynvml(pynvml: Any, library: object, path: str) -> None:
    """pynvml keeps its library handle in a module global under a lock; give it ours. (Loading by
    path first also makes a later dlopen of the soname find this copy.)"""
    lock = getattr(pynvml, "libLoadLock", None)
    if lock is None or not hasattr(pynvml, "nvmlLib"):
        return
    with lock:
        if pynvml.nvmlLib is None:
            pynvml.nvmlLib = library
        elif pynvml.nvmlLib is not library:
            logger.warning("NVML library was already loaded; keeping it wanted=%s", path)
