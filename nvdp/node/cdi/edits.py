"""The container edits of the `gpu` spec (pure), as NVIDIA's container toolkit (nvcdi) writes them.

- Common edits, in NVIDIA's order: env `NVIDIA_CTK_LIBCUDA_DIR` (the driver's library directories)
  and `NVIDIA_VISIBLE_DEVICES=void`; the control device nodes; read-only recursive private bind
  mounts of the driver's files (IPC sockets without `ro`, with `noexec`); the hooks
  `create-symlinks`, `enable-cuda-compat --host-driver-version=<version>`, `update-ldcache`,
  `disable-device-node-modification`, `update-application-profile`, each with `NVIDIA_CTK_DEBUG=false`.
- Device nodes and mounts are sorted as NVIDIA sorts them: shallow paths first, then by path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from nvdp.config.model import EXPLICIT_DRIVER_LIBRARIES_FLAG, IPC_DISCOVERER_OFF_FLAG, NO_ADDITIONAL_GIDS_FLAG
from nvdp.node.cdi.names import CdiSettings
from nvdp.node.cdi.node_files import DevNode, NodeFiles
from nvdp.node.gpus.devices import CONTROL_DEVICES

Spec = dict[str, Any]

MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
DEVICE_PERMISSIONS = "rwm"  # what NVIDIA's spec gives every device node it could stat
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
LIBCUDA_DIR_ENV = "NVIDIA_CTK_LIBCUDA_DIR"
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"
# The hooks, in the order the spec runs them.
CREATE_SYMLINKS = "create-symlinks"
ENABLE_CUDA_COMPAT = "enable-cuda-compat"
UPDATE_LDCACHE = "update-ldcache"
DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"
UPDATE_APPLICATION_PROFILE = "update-application-profile"
HOOKS = (
    CREATE_SYMLINKS,
    ENABLE_CUDA_COMPAT,
    UPDATE_LDCACHE,
    DISABLE_DEVICE_NODE_MODIFICATION,
    UPDATE_APPLICATION_PROFILE,
)

NodeEntry = Callable[[str], Spec]


def device_node(path: str, host_path: str, facts: DevNode | None) -> Spec:
    """A `deviceNodes` entry: with the numbers, mode and group stat found (zero values left out,
    as NVIDIA's Go types leave them out), or the paths alone for a node that is no device."""
    entry: Spec = {"path": path, "hostPath": host_path}
    if facts is None:
        return entry
    for key, value in (("major", facts.major), ("minor", facts.minor), ("fileMode", facts.mode)):
        if value:
            entry[key] = value
    entry["permissions"] = DEVICE_PERMISSIONS
    if facts.gid:
        entry["gid"] = facts.gid
    return entry


def additional_gids(facts: Iterable[DevNode | None], settings: CdiSettings) -> list[int]:
    """The groups a container process needs to open these nodes: that of each character device
    whose group is not root and that others may not both read and write (NVIDIA's rule), unless
    the `no-additional-gids-for-device-nodes` feature flag is set."""
    if settings.feature(NO_ADDITIONAL_GIDS_FLAG):
        return []
    gids = (f.gid for f in facts if f is not None and f.char and f.gid and f.mode & 0o006 != 0o006)
    return list(dict.fromkeys(gids))


def sorted_paths(paths: Iterable[str]) -> list[str]:
    """Shallow paths first, then by path: the order NVIDIA's spec lists nodes and mounts in."""
    return sorted(paths, key=lambda p: (os.path.normpath(p).count("/"), p))


def device_edits(paths: Iterable[str], files: NodeFiles, settings: CdiSettings, node: NodeEntry) -> Spec:
    """The edits that inject these device nodes (and the groups they need)."""
    ordered = sorted_paths(dict.fromkeys(paths))
    edits: Spec = {"deviceNodes": [node(p) for p in ordered]}
    gids = additional_gids((files.dev_nodes.get(p) for p in ordered), settings)
    if gids:
        edits["additionalGids"] = gids
    return edits


def common_edits(files: NodeFiles, settings: CdiSettings, node: NodeEntry) -> Spec:
    """The edits every device of the `gpu` spec shares: env, control nodes, driver files, hooks."""
    driver = files.driver
    host = host_mapper(settings.driver_root)
    env = []
    if driver.library_dirs:
        env.append(f"{LIBCUDA_DIR_ENV}={':'.join(driver.library_dirs)}")
    edits: Spec = {"env": [*env, VISIBLE_DEVICES_VOID]}
    controls = [p for p in CONTROL_DEVICES if p in files.dev_nodes]
    if controls:
        edits.update(device_edits(controls, files, settings, node))
    libraries = [*driver.libraries]
    if settings.feature(EXPLICIT_DRIVER_LIBRARIES_FLAG):
        libraries += driver.explicit_libraries
    mounts = {path: (source, MOUNT_OPTIONS) for path, source in libraries}
    if not settings.feature(IPC_DISCOVERER_OFF_FLAG):
        mounts.update({path: (path, IPC_MOUNT_OPTIONS) for path in driver.ipc_sockets})
    mounts.update({path: (path, MOUNT_OPTIONS) for path in (*driver.firmware, *driver.binaries)})
    if mounts:
        edits["mounts"] = [
            {"hostPath": host(mounts[path][0]), "containerPath": path, "options": list(mounts[path][1])}
            for path in sorted_paths(mounts)
        ]
    hooks = _hooks(settings, driver.links, driver.version, [path for path, _ in libraries])
    if hooks:
        edits["hooks"] = hooks
    return edits


def _hooks(
    settings: CdiSettings, links: Iterable[tuple[str, str]], version: str, libraries: list[str]
) -> list[Spec]:
    args: dict[str, list[str]] = {
        CREATE_SYMLINKS: [a for target, link in links for a in ("--link", f"{target}::{link}")],
        ENABLE_CUDA_COMPAT: [f"--host-driver-version={version}"] if version and "*" not in version else [],
        UPDATE_LDCACHE: [a for d in dict.fromkeys(map(os.path.dirname, libraries)) for a in ("--folder", d)],
        DISABLE_DEVICE_NODE_MODIFICATION: [],
        UPDATE_APPLICATION_PROFILE: [],
    }
    # NVIDIA leaves out a create-symlinks hook without links, and the ldcache hook without libraries.
    needs_args = (CREATE_SYMLINKS, UPDATE_LDCACHE)
    return [
        _hook(settings.hook_path, name, args[name])
        for name in HOOKS
        if settings.hook_enabled(name) and (args[name] or name not in needs_args)
    ]


def _hook(path: str, name: str, args: list[str]) -> Spec:
    """A createContainer hook; `nvidia-ctk` takes its hooks as `nvidia-ctk hook <name>`."""
    program = os.path.basename(path)
    argv = [program, "hook", name] if program == "nvidia-ctk" else [program, name]
    return {"hookName": "createContainer", "path": path, "args": argv + args, "env": list(HOOK_ENV)}


def host_mapper(root: str) -> Callable[[str], str]:
    """A path inside `root` as the host names it."""

    def host(path: str) -> str:
        return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))

    return host
