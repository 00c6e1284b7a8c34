"""`nvdp config check FILE... [--nvml SPEC] [--mig-strategy S]`: validate config files in CI.

- Each FILE is a config file or a directory of ConfigMap entries (names starting `..` skipped).
- Validation is strict: unknown keys are errors here, though the plugin only warns.
- The plugin's support rules apply to what a file states (`nvdp.config.rules.file_problems`); an
  MPS root is not required, as --mps-root / MPS_ROOT may supply it.
- With `--nvml`, the resources the file gives that node are printed, with a warning line per misfit
  (the plugin serves the rest, so it is no error).
- A notice line names each key NVIDIA's plugin ignores and nvdp applies (`nvdp.config.notices`).
- It returns the lines to print and the exit status.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nvdp.base.errors import ConfigError, NvdpError
from nvdp.config import Config, load_file
from nvdp.config import values as v
from nvdp.config.groups import NVML
from nvdp.config.model import MIG_STRATEGIES
from nvdp.config.notices import migration_notices
from nvdp.config.options import flag
from nvdp.config.rules import file_problems
from nvdp.node.nvml.types import GpuInfo
from nvdp.side.configmanager.selection import list_entries


@dataclass(frozen=True)
class CheckFlags:
    nvml: str | None = None  # None: the files only
    mig_strategy: str | None = None  # None: each file's own


CHECK_OPTIONS = (  # flags only: an env var set for the plugin must not change what CI checks
    replace(NVML, envs=(), help=f"also build the resources on this node; {NVML.help}"),
    flag(
        "--mig-strategy",
        v.choice(*MIG_STRATEGIES),
        f"the MIG strategy to check the files with, over their own: {' | '.join(MIG_STRATEGIES)}",
    ),
)


@dataclass(frozen=True)
class Report:
    lines: list[str]
    errors: list[str]

    @property
    def status(self) -> int:
        return 1 if self.errors else 0


def expand(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Files named, with directories replaced by their entries; and the problems found."""
    found: list[str] = []
    problems: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                entries = list_entries(path)
            except NvdpError as error:
                problems.append(str(error))
                continue
            if not entries:
                problems.append(f"{path}: no config entries in this directory")
            found.extend(os.path.join(path, name) for name in entries)
        else:
            found.append(path)
    return found, problems


def check(paths: Sequence[str], nvml: str | None = None, mig_strategy: str | None = None) -> Report:
    files, errors = expand(paths)
    lines: list[str] = []
    gpus = None
    if nvml is not None and files:
        try:
            gpus = _gpus(nvml)
        except NvdpError as error:
            text = str(error)  # the backend's own errors already name --nvml
            return Report(lines, [*errors, text if text.startswith("--nvml") else f"--nvml {nvml}: {text}"])
    for path in files:
        try:
            config = load_file(path, strict=True)
            if mig_strategy is not None:
                config = replace(config, flags=replace(config.flags, mig_strategy=mig_strategy))
        except ConfigError as error:
            errors.extend(f"{error.source or path}: {p}" for p in error.problems)
            continue
        refused = file_problems(config)  # what the plugin would refuse although the file parses
        if refused:
            errors.extend(f"{path}: {p}" for p in refused)
            continue
        if gpus is None:
            lines.append(f"{path}: ok")
        else:
            try:
                lines.extend(_resources(path, config, gpus))
            except NvdpError as error:
                errors.extend(f"{path}: {line}" for line in str(error).split("; "))
                continue
        lines.extend(f"  notice: {line}" for line in migration_notices(config))
    return Report(lines, errors)


def _gpus(spec: str) -> list[GpuInfo]:
    from nvdp.node.nvml import open_nvml

    nvml = open_nvml(spec)
    nvml.init()
    try:
        return list(nvml.gpus())
    finally:
        nvml.shutdown()


def _resources(path: str, config: Config, gpus: list[GpuInfo]) -> list[str]:
    from nvdp.node.gpus.inventory import ResourceRules, dra_gpus, dra_sharing

    rules = ResourceRules.of(config)
    dra, missing = dra_gpus(rules.dra_devices, gpus)
    shared, misfits = dra_sharing(config.dra, gpus)
    built = rules.build([g for g in gpus if g.uuid not in dra])
    lines = [f"{path}: ok, {len(built.resources)} resource(s) (migStrategy {rules.mig_strategy})"]
    for resource in built.resources:
        sharing = f" {resource.sharing} x{resource.replicas}" if resource.sharing else ""
        lines.append(f"  {resource.name}: {len(resource.devices)} device(s){sharing}")
    if dra:
        indices = ", ".join(str(g.index) for g in gpus if g.uuid in dra)
        lines.append(f"  DRA ({len(dra)} GPU(s), not the device plugin's): GPU {indices}")
    for what, uuids in (("shared by capacity", shared.capacity), ("MIG on demand", shared.dynamic_mig)):
        if uuids:
            lines.append(f"  DRA {what}: GPU {', '.join(str(g.index) for g in gpus if g.uuid in uuids)}")
    lines.extend(f"  warning: {misfit.message}" for misfit in (*missing, *misfits, *built.misfits))
    return lines
