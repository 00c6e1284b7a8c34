"""The device nodes an Allocate answer names, checked and watched: a device whose node is missing is
left out (`nvdp.node.gpus.unusable`) and comes back when the node appears.

- Checked only where answers name device nodes: a CDI strategy (the spec's `deviceNodes`) or
  `--pass-device-specs`; with `envvar` / `volume-mounts` alone the runtime finds them itself.
- Their directories (`<dev root>/dev`, `<dev root>/dev/nvidia-caps`) join the supervisor's inotify
  watch: a node that appears or goes wakes it and `changed()` says so; an idle node has no wake-ups.
- Each directory is watched before the nodes in it are looked at.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from nvdp.base.dir_watch import Watcher
from nvdp.node.cdi.roots import inside, visible_roots
from nvdp.node.gpus.resources import NodeResources, Resource
from nvdp.node.gpus.unusable import Unusable, leave_out
from nvdp.plugins.deviceplugin.host_facts import visible_dev_root
from nvdp.plugins.deviceplugin.types import DaemonSettings

REASON = "DeviceNodeMissing"


class DeviceNodes:
    def __init__(self) -> None:
        self._dev_here = ""
        self._paths: tuple[str, ...] = ()  # every node the last check looked for
        self._present: frozenset[str] = frozenset()

    def check(self, resources: Sequence[Resource], settings: DaemonSettings) -> NodeResources:
        """`resources` without the devices whose nodes are missing under the dev root (as this process
        sees it: where CDI specs or control devices are looked up), a misfit per missing set of nodes."""
        if settings.cdi is not None:
            cdi = settings.cdi
            dev_here = visible_roots(cdi.driver_root, cdi.dev_root, cdi.container_driver_root)[1]
        elif settings.response.pass_device_specs:
            dev_here = visible_dev_root(settings.dev_root, settings.container_driver_root)
        else:
            self._paths, self._present = (), frozenset()
            return NodeResources(list(resources))
        self._dev_here = dev_here
        self._paths = tuple(dict.fromkeys(p for r in resources for d in r.devices.values() for p in d.paths))
        self._present = self._look()
        unusable: dict[str, Unusable] = {}
        for resource in resources:
            for device in resource.devices.values():
                missing = [p for p in device.paths if p not in self._present]
                if missing and device.uuid not in unusable:
                    unusable[device.uuid] = Unusable(
                        REASON, missing[0], f"{', '.join(missing)} not found under the dev root {dev_here}"
                    )
        return leave_out(resources, unusable)

    def changed(self, watcher: Watcher) -> bool:
        """Watch the nodes' directories, then say whether a node came or went since `check`."""
        if not self._paths:
            return False
        for directory in dict.fromkeys(os.path.dirname(inside(self._dev_here, p)) for p in self._paths):
            _watch(Path(directory), watcher)
        return self._look() != self._present

    def _look(self) -> frozenset[str]:
        return frozenset(p for p in self._paths if os.path.exists(inside(self._dev_here, p)))


def _watch(directory: Path, watcher: Watcher) -> None:
    """Watch `directory`, or its parent while it does not exist (`/dev/nvidia-caps` is created with
    the first MIG device); a directory made between the two is watched too."""
    if watcher.add(directory):
        return
    watcher.add(directory.parent)
    if directory.is_dir():
        watcher.add(directory)
