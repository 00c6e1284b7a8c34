"""The supervisor's hook: scan, build, write the specs, and say which resources may be advertised.

Called before servers start (so before the first registration) and on every re-enumeration
(SIGHUP, MIG re-partition). A resource is advertised only when every CDI name its Allocate
answers can carry is defined in a spec that is on disk: a spec that cannot be written takes the
resources that need it off the node with one error line, never an answer that does not resolve.
Specs are left in place on stop: running containers may still be resolved through them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvdp.cdi import writer
from nvdp.cdi.names import GPU_CLASS, IMEX_CLASS, MODE_CLASSES, CdiSettings, qualified_name, spec_file_name
from nvdp.cdi.scan import scan_dev, scan_driver, visible_roots
from nvdp.cdi.spec import NodeFiles, build_specs, node_devices, render
from nvdp.devices import parse_mig_minors
from nvdp.logs import log_event
from nvdp.nvml.types import GpuInfo
from nvdp.resources import Resource

log = logging.getLogger(__name__)

MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")


@dataclass(frozen=True)
class PublishResult:
    resources: list[Resource]  # those whose CDI names all resolve in specs on disk
    extra_names: tuple[str, ...]  # names every answer adds (gds/mofed/gdrcopy `all`, IMEX channels)


def answer_names(resource: Resource, settings: CdiSettings) -> list[str]:
    """The `gpu` class names Allocate answers of `resource` can carry (replicas share their GPU's)."""
    ids = {d.index if settings.id_strategy == "index" else d.uuid: None for d in resource.devices.values()}
    return [qualified_name(settings.gpu_kind, i) for i in ids]


def _file_of(name: str) -> str:
    return spec_file_name(name.partition("=")[0])


class CdiPublisher:
    def __init__(self, *, mig_minors_file: Path = MIG_MINORS_FILE) -> None:
        self._mig_minors_file = mig_minors_file
        self._last_problems: tuple[str, ...] = ()

    def publish(
        self,
        settings: CdiSettings,
        gpus: Sequence[GpuInfo],
        resources: Sequence[Resource],
        driver_version: str,
    ) -> PublishResult:
        driver_here, dev_here = visible_roots(
            settings.driver_root, settings.dev_root, settings.container_driver_root
        )
        files = NodeFiles(scan_driver(driver_here, driver_version), scan_dev(dev_here))
        devices = node_devices(gpus, self._mig_minors(gpus), settings.id_strategy)
        built = build_specs(devices, files, settings)
        if built.problems != self._last_problems:
            for problem in built.problems:
                log_event(log, logging.WARNING, "CDI spec entry left out", problem=problem)
            self._last_problems = built.problems
        spec_dir = Path(settings.spec_dir)
        written: set[str] = set()
        failed: dict[str, str] = {}  # file name -> error
        for name, spec in built.specs.items():
            try:
                changed = writer.write_atomic(spec_dir, name, render(spec))
            except OSError as error:
                failed[name] = error.strerror or str(error)
                continue
            written.add(name)
            if changed:
                log_event(log, logging.INFO, "wrote CDI spec", path=str(spec_dir / name), kind=spec["kind"])
        if not failed:
            self._remove_stale(spec_dir, settings, set(built.specs))
        resolvable = {n for n in built.names if _file_of(n) in written}
        extra = tuple(n for n in built.extra_names if n in resolvable)
        advertised: list[Resource] = []
        dropped: dict[str, list[str]] = {name: [] for name in failed}
        for resource in resources:
            # Extra names go into every answer: one that does not resolve takes every resource off.
            missing = [
                n for n in (*answer_names(resource, settings), *built.extra_names) if n not in resolvable
            ]
            if not missing:
                advertised.append(resource)
                continue
            unwritten = [_file_of(n) for n in missing if _file_of(n) in failed]
            if unwritten:
                dropped[unwritten[0]].append(resource.name)
                continue
            log_event(
                log,
                logging.ERROR,
                "not advertising resource: its CDI devices are not in the spec",
                resource=resource.name,
                missing=",".join(missing[:5]) + (f" (+{len(missing) - 5})" if len(missing) > 5 else ""),
            )
        for name, reason in failed.items():
            log_event(
                log,
                logging.ERROR,
                "cannot write CDI spec; resources that need it are not advertised",
                path=str(spec_dir / name),
                error=reason,
                resources=",".join(dropped[name]) or None,
            )
        return PublishResult(advertised, extra)

    def _mig_minors(self, gpus: Sequence[GpuInfo]) -> Mapping[str, int] | None:
        if not any(g.mig_enabled for g in gpus):
            return None
        try:
            return parse_mig_minors(self._mig_minors_file.read_text())
        except OSError:
            return None

    @staticmethod
    def _remove_stale(spec_dir: Path, settings: CdiSettings, wanted: set[str]) -> None:
        """Remove specs of nvdp's classes it no longer offers (e.g. GDS switched off)."""
        for cls in (GPU_CLASS, IMEX_CLASS, *MODE_CLASSES):
            name = spec_file_name(f"{settings.vendor}/{cls}")
            if name not in wanted and writer.remove(spec_dir, name):
                log_event(log, logging.INFO, "removed CDI spec", path=str(spec_dir / name))
