"""What the driver root and the dev root hold (the I/O half of spec generation).

Everything is looked up through the root as this process sees it (the container's mount of the
host's driver root, or the root itself when nvdp runs on the host: `nvdp.node.cdi.roots`) and reported
as paths inside that root (`/usr/lib64/libcuda.so.550.54.15`); `nvdp.node.cdi.spec` maps them to host
paths. What is looked for follows NVIDIA's container toolkit (nvcdi), as named at each list.
"""

from __future__ import annotations

import glob
import os
import stat

from nvdp.node.cdi.node_files import DevNode, DriverFiles
from nvdp.node.cdi.roots import inside
from nvdp.node.nvml.library import LIBRARY_DIRS

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
# NVIDIA's legacy NVVM library (no driver version in its name), found beside the driver's libraries.
LEGACY_LIBRARIES = ("libnvidia-nvvm70.so.*",)
# NVIDIA's list for the `enable-explicit-driver-libraries` feature flag, looked up (symlinks
# followed) in the directories that hold the driver's libraries.
EXPLICIT_LIBRARIES = (
    "libEGL.so",
    "libGL.so",
    "libGLESv1_CM.so",
    "libGLESv2.so",
    "libGLX.so",
    "libGLdispatch.so",
    "libOpenCL.so",
    "libOpenGL.so",
    "libnvidia-api.so",
    "libnvidia-egl-xcb.so",
    "libnvidia-egl-xlib.so",
)
# Links NVIDIA's spec always creates beside a library, whether the host has them or not.
ALWAYS_LINKED = {"libcuda.so": "libcuda.so.1", "libnvidia-opticalflow.so": "libnvidia-opticalflow.so.1"}
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
# NVIDIA's IPC sockets: the first of /run, /var/run that has each.
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
IPC_DIRS = ("/run", "/var/run")
# Device nodes spec generation may name, as globs under the dev root.
DEV_NODE_GLOBS = (
    "/dev/nvidia*",
    "/dev/nvidia-caps/nvidia-cap*",
    "/dev/nvidia-caps-imex-channels/channel*",
    "/dev/infiniband/*",
    "/dev/gdrdrv",
)


def scan_driver(root: str, driver_version: str) -> DriverFiles:
    """The libraries of DRIVER_LIBRARIES at `driver_version` (the first library directory that has
    each, in directory then name order), the legacy and explicit libraries beside them, the links
    NVIDIA's `create-symlinks` hook makes for them, the binaries, the GSP firmware of that version
    and the IPC sockets, under `root`."""
    libraries: list[tuple[str, str, int]] = []  # (path, file, directory's place)
    for name in DRIVER_LIBRARIES:
        # On merged-/usr systems /lib64 and /usr/lib64 are one directory: one mount is enough.
        for place, directory in enumerate(LIBRARY_DIRS):
            path = f"/{directory}/{name}.so.{driver_version}"
            found = _regular_file(root, path)
            if found is not None:
                libraries.append((path, found, place))
                break
    libraries.sort(key=lambda entry: (entry[2], entry[0]))
    versioned = tuple((path, found) for path, found, _ in libraries)
    directories = tuple(dict.fromkeys(os.path.dirname(path) for path, _ in versioned))
    links: dict[tuple[str, str], None] = {}
    for path, found in versioned:
        links.update(dict.fromkeys(_links(root, path, found, driver_version)))
    legacy = tuple(
        (path, found)
        for directory in directories
        for pattern in LEGACY_LIBRARIES
        for path in _below(root, f"{directory}/{pattern}")
        for found in [_regular_file(root, path)]
        if found is not None and not os.path.islink(inside(root, path))
    )
    explicit: dict[tuple[str, str], None] = {}
    for name in EXPLICIT_LIBRARIES:
        found = next(filter(None, (_regular_file(root, f"{d}/{name}") for d in directories)), None)
        if found is not None:
            explicit[(found, found)] = None  # mounted where the symlinks lead, as NVIDIA's locator does
    binaries = [
        found
        for name in BINARIES
        for found in [next(filter(None, (_regular_file(root, f"{d}/{name}") for d in BINARY_DIRS)), None)]
        if found is not None
    ]
    firmware = sorted(
        path
        for d in FIRMWARE_DIRS
        for path in _below(root, f"{d}/{driver_version}/gsp*.bin")
        if os.path.isfile(inside(root, path))
    )
    return DriverFiles(
        version=driver_version,
        libraries=versioned + legacy,
        links=tuple(links),
        explicit_libraries=tuple(explicit),
        binaries=tuple(binaries),
        firmware=tuple(dict.fromkeys(firmware)),
        ipc_sockets=tuple(_ipc_sockets(root)),
    )


def scan_dev(root: str) -> dict[str, DevNode | None]:
    """The device nodes of DEV_NODE_GLOBS that exist under `root`, as /dev/... paths, with their
    numbers, mode and group (lstat, as NVIDIA reads them); None for a path that is not a device
    node (a spec then names it by path alone, as NVIDIA's does)."""
    found: dict[str, DevNode | None] = {}
    for pattern in DEV_NODE_GLOBS:
        for here in sorted(glob.glob(inside(root, pattern))):
            try:
                facts = os.lstat(here)
            except OSError:
                continue  # gone since the glob
            if stat.S_ISDIR(facts.st_mode):
                continue
            path = _within(root, here)
            is_device = stat.S_ISCHR(facts.st_mode) or stat.S_ISBLK(facts.st_mode)
            found[path] = (
                DevNode(
                    os.major(facts.st_rdev),
                    os.minor(facts.st_rdev),
                    stat.S_IMODE(facts.st_mode),
                    facts.st_gid,
                    stat.S_ISCHR(facts.st_mode),
                )
                if is_device
                else None
            )
    return found


def _links(root: str, path: str, found: str, version: str) -> list[tuple[str, str]]:
    """(target, link) pairs for a library at `path`: NVIDIA's fixed links, then the SONAME link
    (`libcuda.so.1` -> the library) and the `.so` link (`libcuda.so` -> the SONAME), each only
    where the host has that link. The SONAME is the host's link that resolves to the library."""
    directory, name = os.path.split(path)
    stem = name.removesuffix(f".{version}")  # libcuda.so
    out = [(target, f"{directory}/{stem}") for link, target in ALWAYS_LINKED.items() if link == stem]
    sonames = sorted(
        (os.path.basename(candidate) for candidate in _below(root, f"{directory}/{stem}.*")),
        key=lambda n: (len(n), n),
    )
    soname = next(
        (
            n
            for n in sonames
            if n != name
            and os.path.islink(inside(root, f"{directory}/{n}"))
            and _regular_file(root, f"{directory}/{n}") == found
        ),
        None,
    )
    if soname is not None:
        out.append((name, f"{directory}/{soname}"))
    target = soname or name
    if stem != target and os.path.islink(inside(root, f"{directory}/{stem}")):
        out.append((target, f"{directory}/{stem}"))
    return out


def _ipc_sockets(root: str) -> list[str]:
    sockets = []
    for socket in IPC_SOCKETS:
        for directory in IPC_DIRS:
            here = inside(root, f"{directory}/{socket}")
            if os.path.exists(here) and not os.path.isdir(here):
                sockets.append(f"{directory}/{socket}")
                break
    return sockets


def _below(root: str, pattern: str) -> list[str]:
    """The paths inside `root` that match `pattern` (absolute, inside the root), sorted."""
    return sorted(_within(root, p) for p in glob.glob(inside(root, pattern)))


def _within(root: str, here: str) -> str:
    """A path found under `root` (as glob gives it, with `root` in front) as a path inside it."""
    return here if root in ("", "/") else "/" + here[len(root) :].lstrip("/")


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
