"""The CDI spec of each prepared claim, `<cdi root>/k8s.gpu.nvidia.com-claim_<uid>.json`, kind
`k8s.gpu.nvidia.com/claim`: one device `<uid>-<device>` per claimed device with its nodes, and the
driver's common edits, built and written as the device plugin's (`nvdp.node.cdi.spec.build_specs`).

- NVIDIA's DRA driver's YAML spec of a claim stays until unprepared here; one no claim owns is removed.
- File and device names identify the claim: an unreadable checkpoint is rebuilt from the specs
  (and the API), never removed with it.
- The builder's `all` device is left out: a runtime refuses a name two specs of one kind define.
- A device whose nodes are missing under the dev root keeps its claim from being prepared (the
  error names it).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.dirs import make_dirs
from nvdp.base.errors import UnreadableFile
from nvdp.base.files import read_bounded, write_atomic
from nvdp.node.cdi.names import CdiSettings, qualified_name
from nvdp.node.cdi.node_files import DevNode, DriverFiles, NodeFiles
from nvdp.node.cdi.roots import visible_roots
from nvdp.node.cdi.scan import scan_dev, scan_driver
from nvdp.node.cdi.spec import CdiDevice, build_specs, render
from nvdp.plugins.dra.claims import ClaimError
from nvdp.plugins.dra.devices import DraDevice
from nvdp.plugins.dra.names import CLAIM_CDI_KIND, claim_cdi_device, claim_spec_file
from nvdp.plugins.dra.options import DraSettings

_SPEC_FILE = re.compile(
    re.escape(claim_spec_file("X").removesuffix(".json")).replace("X", "(?P<uid>[A-Za-z0-9-]+)")
    + r"\.(json|yaml)$"
)
MAX_SPEC_BYTES = 1 << 20


class ClaimSpecs:
    """Writes and removes claims' specs in `settings.spec_dir`. `dev_nodes()` lists the device nodes
    present under the dev root now (read for every claim: MIG devices bring theirs when created);
    `driver` is what was found under the driver root."""

    def __init__(
        self,
        settings: CdiSettings,
        driver: DriverFiles,
        dev_nodes: Callable[[], Mapping[str, DevNode | None]],
    ) -> None:
        self.settings = replace(settings, gpu_kind=CLAIM_CDI_KIND, modes=(), imex_channels=())
        self.root = Path(settings.spec_dir)
        self._driver = driver
        self._dev_nodes = dev_nodes

    @classmethod
    def of_node(cls, settings: DraSettings, driver_version: str) -> ClaimSpecs:
        """The specs of `nvdp dra-kubelet-plugin`: in its CDI root, the driver's files and device nodes
        as this container sees them under the driver and dev roots its settings name."""
        flags = settings.config.flags
        container_root = flags.plugin.container_driver_root
        driver_here, dev_here = visible_roots(flags.nvidia_driver_root, flags.dev_root, container_root)
        cdi = CdiSettings(
            spec_dir=settings.cdi_root,
            driver_root=flags.nvidia_driver_root,
            container_driver_root=container_root,
            dev_root=flags.dev_root,
            hook_path=flags.plugin.nvidia_ctk_path,
            disabled_hooks=settings.runtime.cdi_disable_hooks,
        )
        return cls(cdi, scan_driver(driver_here, driver_version), lambda: scan_dev(dev_here))

    def dev_nodes(self) -> Mapping[str, DevNode | None]:
        """The device nodes under the dev root now (one read for a call's claims)."""
        return self._dev_nodes()

    def write(
        self,
        uid: str,
        devices: Sequence[DraDevice],
        dev_nodes: Mapping[str, DevNode | None] | None = None,
        edits: Mapping[str, Mapping[str, list[Any]]] | None = None,
    ) -> dict[str, str]:
        """Write the claim's spec; device name -> its qualified CDI name. No devices: no spec.
        `dev_nodes`: as `dev_nodes()` said (read now when not given); `edits`: device name -> more
        containerEdits lists for it (an MPS client's env and mounts). Raises ClaimError (a device left
        out of the spec, and why) or OSError (not written)."""
        if not devices:
            return {}
        cdi = [CdiDevice(claim_cdi_device(uid, d.name), d.paths) for d in devices]
        nodes = self._dev_nodes() if dev_nodes is None else dev_nodes
        built = build_specs(cdi, NodeFiles(self._driver, nodes), self.settings)
        if built.left_out:
            why = "; ".join(
                f"{name.removeprefix(uid + '-')}: {reason}" for name, reason in built.left_out.items()
            )
            raise ClaimError(f"no CDI spec for {why}")
        (spec,) = built.specs.values()
        spec["devices"] = [d for d in spec["devices"] if d["name"] != "all"]
        for device in devices:
            for key, more in (edits or {}).get(device.name, {}).items():
                cdi_device = next(
                    d for d in spec["devices"] if d["name"] == claim_cdi_device(uid, device.name)
                )
                cdi_device["containerEdits"][key] = [*cdi_device["containerEdits"].get(key, []), *more]
        make_dirs(self.root)
        write_atomic(self.root / claim_spec_file(uid), render(spec))
        return {d.name: qualified_name(CLAIM_CDI_KIND, claim_cdi_device(uid, d.name)) for d in devices}

    def remove(self, uid: str) -> None:
        """Remove the claim's spec, and NVIDIA's driver's (YAML, of a claim it prepared), where there
        (gone already: nothing to do). Raises OSError."""
        ours = self.root / claim_spec_file(uid)
        for path in (ours, ours.with_suffix(".yaml")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def devices(self, uid: str) -> list[str] | None:
        """The device names nvdp's spec of the claim names; None when there is none or it cannot be
        read (NVIDIA's YAML spec is not read)."""
        path = self.root / claim_spec_file(uid)
        try:
            spec = loads_json(read_bounded(path, MAX_SPEC_BYTES), max_bytes=MAX_SPEC_BYTES)
        except (UnreadableFile, ValueError):
            return None
        found = spec.get("devices") if isinstance(spec, dict) else None
        names = [d.get("name") for d in found if isinstance(d, dict)] if isinstance(found, list) else []
        prefix = claim_cdi_device(uid, "")
        return [n.removeprefix(prefix) for n in names if isinstance(n, str) and n.startswith(prefix)]

    def on_disk(self) -> set[str]:
        """The UIDs of the claims whose specs are in the spec directory."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return set()
        return {m["uid"] for name in names if (m := _SPEC_FILE.match(name))}
