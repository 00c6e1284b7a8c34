"""`nvdp mps-control-daemon`: NVIDIA's command, flags and env vars (`--config-file`,
`--mig-strategy`, `--fail-on-init-error`, `--nvidia-driver-root`, `--mps-root`), plus nvdp's `--nvml`,
`--log-format`, `--log-level` and `--mps-health-interval`; and `mount-shm` (the init step that mounts
a tmpfs at `<root>/shm`). The flags are the plugin's options, resolved by the plugin family's resolver
(`nvdp.config.resolve_command`), so the config file, precedence and every validation line are the
same. cli.py wires the signals.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nvdp.base.dirs import make_dirs
from nvdp.base.errors import NvdpError
from nvdp.base.logs import log_event, setup_logging
from nvdp.config import PLUGIN_OPTIONS, Config, PluginOptions, resolve_command
from nvdp.config import values as v
from nvdp.config.model import MPS
from nvdp.config.options import add_options, flag, flags_only_for
from nvdp.config.rules import plugin_problems
from nvdp.node.gpus.inventory import ResourceRules
from nvdp.node.gpus.misfit_report import MisfitReport
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import ComputeModes, Nvml

from .controller import MpsController
from .layout import MpsRoot
from .plan import DaemonPlan, daemon_plans

log = logging.getLogger(__name__)

DEFAULT_MPS_ROOT = "/run/nvidia/mps"
FLAGS = (
    "--config-file --mig-strategy --fail-on-init-error --nvidia-driver-root --mps-root --nvml --log-format"
    " --log-level"
).split()
HEALTH_ENV = "MPS_HEALTH_INTERVAL"
SHM_MOUNT_OPTIONS = "rw,nosuid,nodev,noexec,relatime,size=65536k"  # NVIDIA's mount-shm
BACKOFF_CAP_S = 30.0


class NodeNvml(Nvml, ComputeModes, Protocol):
    """NVML with compute modes: what the control daemon needs (both backends)."""


MPS_OPTIONS = (
    *flags_only_for(FLAGS, PLUGIN_OPTIONS),  # the other plugin settings: from their env vars only
    flag(
        f"--mps-health-interval ${HEALTH_ENV}",
        v.duration(positive=True),
        "how often each MPS daemon is queried through its pipe",
        "seconds",
        target="health_interval",
        label="given",
    ),
)


@dataclass(frozen=True)
class MpsOptions(PluginOptions):
    """The plugin's options the daemon reads, and how often it queries each daemon."""

    health_interval: float = 5.0  # seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, MPS_OPTIONS, MpsOptions)
    sub = parser.add_subparsers(dest="mps_command", metavar="COMMAND")
    sub.add_parser("mount-shm", help="mount a tmpfs at <mps-root>/shm (NVIDIA's init step)")


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> MpsOptions:
    """The daemon's options (flag > env > config file > default) under the plugin's rules."""
    return resolve_command(MpsOptions, MPS_OPTIONS, args, environ, rules=plugin_problems)


def mps_root(config: Config) -> MpsRoot:
    return MpsRoot(Path(config.flags.mps_root or DEFAULT_MPS_ROOT))


def node_plans(config: Config, nvml: Nvml) -> dict[str, DaemonPlan]:
    """The daemons this node needs under `config` (the plugin builds the same resources)."""
    if config.sharing.strategy != MPS:
        return {}
    built = ResourceRules.of(config).build(nvml.gpus())
    MisfitReport().update("resources", built.misfits)
    return daemon_plans(built.resources)


@dataclass
class Prepared:
    controller: MpsController
    plans: dict[str, DaemonPlan]
    nvml: NodeNvml


def prepare(args: argparse.Namespace, environ: Mapping[str, str]) -> Prepared:
    """Resolve the config, open NVML and build the controller. Raises NvdpError (config errors before
    logging is set up; NVML init errors only when fail-on-init-error)."""
    options = resolve(args, environ)
    config, interval = options.config, options.health_interval
    setup_logging(options.runtime.log_format, options.runtime.log_level)
    log_event(log, logging.INFO, "starting nvdp mps-control-daemon", config=json.loads(options.to_json()))
    flags = config.flags
    nvml: NodeNvml = open_nvml(  # type: ignore[assignment]
        options.runtime.nvml, flags.nvidia_driver_root, flags.plugin.container_driver_root, environ=environ
    )
    state = {"config": config, "nvml_ok": False}

    def load() -> dict[str, DaemonPlan]:
        current = state["config"]
        assert isinstance(current, Config)
        if not state["nvml_ok"]:
            nvml.init()
            state["nvml_ok"] = True
        return node_plans(current, nvml)

    def reload() -> dict[str, DaemonPlan]:
        state["config"] = resolve(args, environ).config
        return load()

    plans: dict[str, DaemonPlan] = {}
    idle_reason = None
    try:
        plans = load()
    except NvdpError as error:
        if config.flags.fail_on_init_error:
            raise
        idle_reason = str(error)  # logged by run(), once the signal handlers are in place
    controller = MpsController(
        nvml,
        mps_root(config),
        reload,
        environ,
        health_interval=interval,
        backoff_base=min(1.0, interval),
        backoff_cap=BACKOFF_CAP_S,
        idle_reason=idle_reason,
    )
    return Prepared(controller, plans, nvml)


def mount_shm(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Mount a fresh tmpfs at `<root>/shm` (unmounting an old one), as NVIDIA's `mount-shm`."""
    shm = mps_root(resolve(args, environ).config).shm_dir
    if os.path.ismount(shm):
        _run(["umount", str(shm)], f"unmount {shm}")
    try:
        make_dirs(shm)
    except OSError as error:
        raise NvdpError(f"cannot create {shm}: {error.strerror}") from error
    _run(["mount", "-t", "tmpfs", "-o", SHM_MOUNT_OPTIONS, "shm", str(shm)], f"mount a tmpfs at {shm}")


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NvdpError(f"cannot {what}: {error}") from error
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise NvdpError(f"cannot {what}: {lines[-1] if lines else f'exit status {done.returncode}'}")
