"""The supervisor's CDI hook: claim the spec directory, build, write and keep the specs, and say which
devices may be advertised. It runs before servers start and on every apply.

- A device is advertised only when every CDI name its Allocate can carry is in a spec on disk;
  what keeps one out is a misfit (`nvdp.node.gpus.misfits`) and the rest is served.
- A device left out of the spec (`CdiDeviceNotInSpec`) is left out of its resources; an unwritable
  spec (`CdiSpecNotWritten`) or a directory another plugin holds (`CdiSpecDirInUse`) withholds the
  resources that need it, retried with capped backoff (`retry_in`).
- Before writing, it takes `<spec dir>/.<vendor>.lock` (`nvdp.base.lock_file`) noting `pid=... host=...`;
  it is removed on stop (waking a waiting plugin's watch) and taken again if removed under us.
- The spec directory is in the supervisor's watch (`changed`): a spec removed or changed is written
  again (content compared, so own writes do not loop). Specs stay on stop; the lock is released.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvdp.base.backoff import delay_after
from nvdp.base.dir_watch import IN_CLOSE_WRITE, Watcher
from nvdp.base.lock_file import LockFile
from nvdp.base.logs import log_event
from nvdp.node.cdi import writer
from nvdp.node.cdi.names import (
    GPU_CLASS,
    IMEX_CLASS,
    MODE_CLASSES,
    CdiSettings,
    qualified_name,
    spec_file_name,
)
from nvdp.node.cdi.node_files import NodeFiles
from nvdp.node.cdi.roots import visible_roots
from nvdp.node.cdi.scan import scan_dev, scan_driver
from nvdp.node.cdi.spec import build_specs, node_devices, render
from nvdp.node.gpus.devices import MIG_MINORS_FILE, parse_mig_minors
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import Resource
from nvdp.node.gpus.unusable import Unusable, leave_out
from nvdp.node.nvml.types import GpuInfo

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 10.0


@dataclass(frozen=True)
class PublishResult:
    resources: list[Resource]  # with only the devices whose CDI names all resolve in specs on disk
    extra_names: tuple[str, ...]  # names every answer adds (gds/mofed/gdrcopy `all`, IMEX channels)
    misfits: tuple[Misfit, ...] = ()  # what kept devices or resources out


def answer_names(resource: Resource, settings: CdiSettings) -> list[str]:
    """The `gpu` class names Allocate answers of `resource` can carry (replicas share their GPU's)."""
    ids = {d.index if settings.id_strategy == "index" else d.uuid: None for d in resource.devices.values()}
    return [qualified_name(settings.gpu_kind, i) for i in ids]


def _file_of(name: str) -> str:
    return spec_file_name(name.partition("=")[0])


def _settled(path: Path, content: bytes) -> writer.Fingerprint | None:
    """The fingerprint of the file at `path` when it holds `content` and did not change while it was
    read; else None, so that the next look compares the content (whoever changed it meanwhile also
    woke the watch)."""
    before = writer.fingerprint(path)
    if before is None or writer.read_spec(path, len(content)) != content:
        return None
    return before if writer.fingerprint(path) == before else None


def _withheld(names: Sequence[str]) -> str:
    return f"{', '.join(names)} not advertised" if names else "no specs written"


@dataclass
class _Kept:
    content: bytes
    fingerprint: writer.Fingerprint | None  # of the file when last found to hold `content`


class CdiPublisher:
    def __init__(
        self, *, mig_minors_file: Path = MIG_MINORS_FILE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._mig_minors_file = mig_minors_file
        self._clock = clock
        self._lock: LockFile | None = None  # the spec directory's, while held
        self._last_problems: tuple[str, ...] = ()
        self._spec_dir: Path | None = None
        self._kept: dict[Path, _Kept] = {}  # specs written: kept in place while we serve
        self._failures = 0  # publishes in a row that could not write every spec
        self._retry_at: float | None = None  # when to publish again (monotonic), after a failure
        self._waiting_for: Path | None = None  # the lock file another plugin holds

    # ---- one publish ----------------------------------------------------------------------------
    def publish(
        self,
        settings: CdiSettings,
        gpus: Sequence[GpuInfo],
        resources: Sequence[Resource],
        driver_version: str,
    ) -> PublishResult:
        spec_dir = Path(settings.spec_dir)
        self._spec_dir = spec_dir
        self._kept = {}
        self._waiting_for = None
        names = [r.name for r in resources]
        unusable = self._claim(spec_dir, settings.vendor, names)
        if unusable is not None:
            return self._failed(PublishResult([], (), (unusable,)))
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
        written: set[str] = set()
        failed: dict[str, str] = {}  # file name -> error
        for name, spec in built.specs.items():
            content = render(spec)
            try:
                changed = writer.write_spec(spec_dir, name, content)
            except OSError as error:
                failed[name] = error.strerror or str(error)
                continue
            written.add(name)
            self._kept[spec_dir / name] = _Kept(content, _settled(spec_dir / name, content))
            if changed:
                log_event(log, logging.INFO, "wrote CDI spec", path=str(spec_dir / name), kind=spec["kind"])
        if not failed:
            self._remove_stale(spec_dir, settings, set(built.specs))
        resolvable = {n for n in built.names if _file_of(n) in written}
        misfits: list[Misfit] = []
        # Extra names go into every answer: one whose spec was not written withholds every resource.
        needs: dict[str, list[str]] = {}
        for resource in resources:
            for file in dict.fromkeys(
                _file_of(n) for n in (*answer_names(resource, settings), *built.extra_names)
            ):
                if file in failed:
                    needs.setdefault(file, []).append(resource.name)
        for file, why in failed.items():
            withheld = needs.get(file, [])
            misfits.append(
                Misfit(
                    "CdiSpecNotWritten",
                    str(spec_dir / file),
                    f"cannot write CDI spec {spec_dir / file}: {why}; "
                    f"{_withheld(withheld)} until it can be written (retrying)",
                    withholds=tuple(withheld),
                )
            )
        blocked = {n for withheld in needs.values() for n in withheld}
        kept = leave_out(
            [r for r in resources if r.name not in blocked],
            self._not_in_spec(resources, settings, resolvable, built.left_out),
        )
        result = PublishResult(
            kept.resources,
            tuple(n for n in built.extra_names if n in resolvable),
            (*misfits, *kept.misfits),
        )
        if failed:
            return self._failed(result)
        self._failures, self._retry_at = 0, None
        return result

    def _claim(self, spec_dir: Path, vendor: str, names: list[str]) -> Misfit | None:
        """Take the spec directory's lock: None when held, else the misfit that withholds `names`."""
        path = spec_dir / f".{vendor}.lock"
        what = _withheld(names)
        try:
            writer.ensure_dir(spec_dir)
            holder = self._take_lock(path)
        except OSError as error:
            return Misfit(
                "CdiSpecNotWritten",
                str(spec_dir),
                f"cannot use CDI spec directory {spec_dir}: {error.strerror or error}; {what} until it "
                "can be written (retrying)",
                withholds=tuple(names),
            )
        if holder is None:
            return None
        self._waiting_for = path
        return Misfit(
            "CdiSpecDirInUse",
            str(path),
            f"CDI spec directory {spec_dir} is in use by another device plugin (lock {path} held by "
            f"{holder or 'unknown (it has not said who it is yet)'}); {what} until it is released",
            withholds=tuple(names),
        )

    def _take_lock(self, path: Path) -> str | None:
        """Hold the lock at `path` (kept when held there): None on success, else who holds it."""
        lock = self._lock
        if lock is None or lock.path != path:
            self._release_lock()
            lock = LockFile(path, note=f"pid={os.getpid()} host={socket.gethostname()}")
        self._lock = None
        holder = lock.acquire()
        if holder is None:
            self._lock = lock
        return holder

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @staticmethod
    def _not_in_spec(
        resources: Sequence[Resource], settings: CdiSettings, resolvable: set[str], why: Mapping[str, str]
    ) -> dict[str, Unusable]:
        """Device uuid -> why its CDI name is not in a spec on disk (a valid spec left it out)."""
        out: dict[str, Unusable] = {}
        for resource in resources:
            for device in resource.devices.values():
                device_id = device.index if settings.id_strategy == "index" else device.uuid
                name = qualified_name(settings.gpu_kind, device_id)
                if name not in resolvable and device.uuid not in out:
                    reason = why.get(device_id)
                    text = f"not in the CDI spec ({reason})" if reason else "not in the CDI spec"
                    out[device.uuid] = Unusable("CdiDeviceNotInSpec", name, text)
        return out

    def _failed(self, result: PublishResult) -> PublishResult:
        self._failures += 1
        self._retry_at = self._clock() + self._delay()
        return result

    def _delay(self) -> float:
        return delay_after(self._failures, RETRY_MIN_S, RETRY_MAX_S)

    # ---- between publishes ----------------------------------------------------------------------
    def retry_in(self) -> float | None:
        """Seconds until the next publish is due after a failure; None when all is well."""
        if self._retry_at is None:
            return None
        return max(0.0, self._retry_at - self._clock())

    def changed(self, watcher: Watcher) -> bool:
        """Watch the spec directory; write back a kept spec that was removed or changed. True when
        the supervisor should publish again: a retry is due, the lock we wait for was released, or
        a spec (or the lock) could not be kept."""
        spec_dir = self._spec_dir
        if spec_dir is None:
            return False
        watcher.add(spec_dir, IN_CLOSE_WRITE)
        if self._retry_at is not None:
            if self._clock() >= self._retry_at:  # the next one is due later, should this one not publish
                self._retry_at = self._clock() + self._delay()
                return True
            waiting = self._waiting_for
            return waiting is not None and not waiting.exists()
        kept = self._keep()
        watcher.add(spec_dir, IN_CLOSE_WRITE)  # the directory itself may have been made again
        return not kept

    def _keep(self) -> bool:
        """Hold the lock and write back every kept spec that is not as we wrote it. False when
        either cannot be done."""
        lock = self._lock
        if lock is not None and not lock.held:  # the lock file went with the directory
            path = lock.path
            try:
                writer.ensure_dir(path.parent)
                if self._take_lock(path) is not None:
                    return False
            except OSError:
                return False
            log_event(log, logging.INFO, "CDI spec directory lock taken again", path=str(path))
        for spec, kept in self._kept.items():
            now = writer.fingerprint(spec)
            if now is not None and now == kept.fingerprint:
                continue
            if now is not None and writer.read_spec(spec, len(kept.content)) == kept.content:
                kept.fingerprint = now  # touched, or written again with the same content
                continue
            what = "removed" if now is None else "changed"
            try:
                writer.write_spec(spec.parent, spec.name, kept.content)
            except OSError as error:
                log_event(
                    log,
                    logging.ERROR,
                    f"CDI spec {what} under the plugin and cannot be written back",
                    path=str(spec),
                    error=error.strerror or str(error),
                )
                return False
            kept.fingerprint = _settled(spec, kept.content)
            log_event(log, logging.WARNING, f"CDI spec {what} under the plugin; written back", path=str(spec))
        return True

    def close(self) -> None:
        """Stop keeping the specs (they stay on disk) and release the spec directory's lock."""
        self._release_lock()
        self._kept = {}
        self._spec_dir = self._waiting_for = None
        self._failures, self._retry_at = 0, None

    # ---- helpers ------------------------------------------------------------------------------
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
