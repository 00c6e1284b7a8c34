"""A fake driver root for the tests and the benchmarks: the driver's libraries, binaries, firmware
and the device nodes of a node's GPUs, as CDI spec generation finds them on a node (`make_node`)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from nvdp.node.gpus.devices import gpu_device, mig_cap_paths, mig_device
from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo

DRIVER_VERSION = "550.54.15"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
LIBRARIES = ("libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler", "libcudadebugger", "libnvidia-allocator")


def make_node(
    root: Path,
    gpus: Sequence[GpuInfo],
    *,
    extra_nodes: Iterable[str] = (),
    mig_minors: dict[str, int] | None = None,
) -> bool:
    """A driver root (= dev root) with the driver's libraries (plus `.so.1` SONAME symlinks, `.so`
    symlinks for two of them, a library of another version, a library reached through a symlink,
    NVIDIA's legacy NVVM library and a GL library behind two symlinks), binaries, firmware,
    nvidia-persistenced's socket, the control nodes and every device node the GPUs need. Device
    nodes are character devices (mode 0666, numbers as the driver gives them: `device_numbers`)
    when mknod is permitted, else empty files. Returns whether mknod worked."""
    lib = root / LIB_DIR
    lib.mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        path = lib / f"{name}.so.{DRIVER_VERSION}"
        path.write_bytes(b"\x7fELF fake " + name.encode())
        (lib / f"{name}.so.1").symlink_to(path.name)
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (lib / "libnvidia-ml.so").symlink_to("libnvidia-ml.so.1")
    (lib / "libnvidia-nvvm70.so.4").write_bytes(b"\x7fELF legacy nvvm")
    (lib / "libEGL.so.1.1.0").write_bytes(b"\x7fELF glvnd")
    (lib / "libEGL.so.1").symlink_to("libEGL.so.1.1.0")
    (lib / "libEGL.so").symlink_to("libEGL.so.1")
    (root / "lib64").symlink_to(LIB_DIR)  # merged /usr: the same libraries under a second name
    (lib / "libcuda.so.535.104.05").write_bytes(b"\x7fELF other version")
    real = root / "opt/nvidia/libnvidia-cfg.so.real"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"\x7fELF cfg")
    (lib / f"libnvidia-cfg.so.{DRIVER_VERSION}").symlink_to("/opt/nvidia/libnvidia-cfg.so.real")
    for binary in ("nvidia-smi", "nvidia-persistenced"):
        path = root / "usr/bin" / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"#!fake")
    firmware = root / "lib/firmware/nvidia" / DRIVER_VERSION / "gsp_ga10x.bin"
    firmware.parent.mkdir(parents=True)
    firmware.write_bytes(b"gsp")
    socket = root / "run/nvidia-persistenced/socket"
    socket.parent.mkdir(parents=True)
    socket.touch()  # a socket to the spec, which only checks that it is no directory
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *extra_nodes]
    for gpu in gpus:
        nodes += gpu_device(gpu).paths
        for mig in gpu.mig_devices:
            nodes += mig_device(gpu, mig, mig_minors).paths
    mknod_ok = True
    for node in dict.fromkeys(nodes):
        mknod_ok = make_char_device(root / node.lstrip("/")) and mknod_ok
    return mknod_ok


def device_numbers(path: str) -> tuple[int, int]:
    """(major, minor) of a device node as a host gives them: 195 for the GPUs and nvidiactl, and
    dynamic majors (here 510, 511, 512, 513) for nvidia-uvm, the caps, IMEX channels and the rest."""
    name = os.path.basename(path)
    fixed = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254), "nvidia-uvm": (510, 0)}
    if name in fixed:
        return fixed[name]
    if name == "nvidia-uvm-tools":
        return 510, 1
    number = int(re.sub(r"\D", "", name) or 0)
    if re.fullmatch(r"nvidia\d+", name):
        return 195, number
    return (511 if name.startswith("nvidia-cap") else 512 if name.startswith("channel") else 513), number


def make_char_device(path: Path, mode: int = 0o666) -> bool:
    """A character device at `path` (numbers by its name: `device_numbers`; `mode` whatever the
    umask), or an empty file where mknod is not permitted; False then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return True
    try:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(*device_numbers(str(path))))
    except (PermissionError, OSError):
        path.touch()
        return False
    os.chmod(path, mode)
    return True


def cap_files(root: Path, gpus: list[GpuInfo]) -> None:
    """The MIG capability nodes of every GPU instance a placement may get (the node's, made empty)."""
    for gpu in gpus:
        for gi in range(15):
            for path in mig_cap_paths(
                gpu.minor, MigDeviceInfo("", 0, gi, 0, "", 0, gpu.uuid, gpu.index), None
            ):
                (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                (root / path.lstrip("/")).touch()
