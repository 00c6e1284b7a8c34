"""`nvdp` command line. `nvidia-device-plugin` is `nvdp plugin`.

This module is the only place that prints, installs signal handlers or chooses exit codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from nvdp import __version__
from nvdp.errors import NvdpError
from nvdp.logs import log_event, setup_logging

log = logging.getLogger("nvdp")

SIM_PROFILES = ("dgx-a100", "dgx-a100-mig", "pcie-4", "dgx-h100")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nvdp", description="Kubernetes NVIDIA GPU device plugin.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"nvdp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plugin = sub.add_parser(
        "plugin", help="run the device plugin daemon (same as nvidia-device-plugin)", allow_abbrev=False
    )
    _add_plugin_arguments(plugin)
    simulate = sub.add_parser(
        "simulate",
        help="run the plugin on a simulated GPU node against an in-process kubelet",
        allow_abbrev=False,
    )
    _add_simulate_arguments(simulate)
    mps = sub.add_parser(
        "mps-control-daemon",
        help="run one MPS control daemon per MPS-shared resource (NVIDIA's mps-control-daemon)",
        allow_abbrev=False,
    )
    from nvdp.mps.command import add_arguments as add_mps_arguments

    add_mps_arguments(mps)
    args = parser.parse_args(argv)
    if args.command == "plugin":
        return run_plugin(args, os.environ)
    if args.command == "mps-control-daemon":
        return run_mps_control_daemon(args, os.environ)
    return run_simulate(args, os.environ)


def plugin_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `nvidia-device-plugin`: NVIDIA's binary name, same flags."""
    parser = argparse.ArgumentParser(
        prog="nvidia-device-plugin", description="NVIDIA device plugin (nvdp).", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"nvdp {__version__}")
    _add_plugin_arguments(parser)
    return run_plugin(parser.parse_args(argv), os.environ)


def mps_control_daemon_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `mps-control-daemon`: NVIDIA's binary name for `nvdp mps-control-daemon`."""
    from nvdp.mps.command import add_arguments

    parser = argparse.ArgumentParser(
        prog="mps-control-daemon", description="NVIDIA MPS control daemon (nvdp).", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"nvdp {__version__}")
    add_arguments(parser)
    return run_mps_control_daemon(parser.parse_args(argv), os.environ)


def _add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.config import add_plugin_flags

    add_plugin_flags(parser)


def _add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.config import add_plugin_flags

    parser.add_argument(
        "--profile",
        choices=SIM_PROFILES,
        default=None,
        help="built-in simulated node (default dgx-a100); same as --nvml sim:NAME",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep serving after the demo until Ctrl-C (health changes are printed)",
    )
    add_plugin_flags(parser)


def _exit_on_error(error: NvdpError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 1


def run_plugin(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.footprint import block_ssl

    block_ssl()  # before grpc is imported; see nvdp/footprint.py
    from nvdp.config import resolve
    from nvdp.daemon import Daemon

    try:
        config = resolve(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    setup_logging(config.log_format, config.log_level)
    try:
        daemon = Daemon(config, reload_config=lambda: resolve(args, environ), environ=environ)
    except NvdpError as error:
        log_event(log, logging.ERROR, "cannot start", error=str(error))
        return 1
    _install_signal_handlers(daemon.request_stop, daemon.request_reload)
    try:
        daemon.run()
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1
    return 0


def run_mps_control_daemon(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.mps.command import mount_shm, prepare

    try:
        if args.mps_command == "mount-shm":
            mount_shm(args, environ)
            return 0
        prepared = prepare(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    _install_signal_handlers(prepared.controller.request_stop, prepared.controller.request_reload)
    try:
        prepared.controller.run(prepared.plans)
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1
    finally:
        prepared.nvml.shutdown()
    return 0


def _install_signal_handlers(stop: Callable[[], None], reload: Callable[[], None]) -> None:
    def on_stop(signum: int, frame: FrameType | None) -> None:
        log_event(log, logging.INFO, "signal received; stopping", signal=signal.Signals(signum).name)
        stop()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        log_event(log, logging.INFO, "SIGHUP received; reloading")
        reload()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)


def run_simulate(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.config import resolve
    from nvdp.simulate import Simulation

    env = dict(environ)
    if args.profile is not None:
        args.nvml = f"sim:{args.profile}"
    elif getattr(args, "nvml", None) is None and "NVDP_NVML" not in env:
        args.nvml = "sim:dgx-a100"
    plugin_dir = Path(tempfile.mkdtemp(prefix="nvdp-sim-", dir="/tmp"))
    args.kubelet_socket = str(plugin_dir / "kubelet.sock")
    if getattr(args, "metrics_address", None) is None:
        args.metrics_address = ""  # a demo should not take a port unless asked
    if getattr(args, "mps_root", None) is None and "MPS_ROOT" not in env:
        args.mps_root = str(plugin_dir / "mps")  # no MPS daemon runs here: see nvdp.mps.simulated
    try:
        config = resolve(args, env)
        from nvdp.mps.simulated import skip_daemon

        mps_note = skip_daemon(config)
    except NvdpError as error:
        _remove_dir(plugin_dir)
        return _exit_on_error(error)
    if mps_note:
        print(mps_note)
    setup_logging(config.log_format, "warning" if config.log_level == "info" else config.log_level)
    stop = threading.Event()
    if args.serve:
        _install_signal_handlers(stop.set, lambda: None)
    try:
        with Simulation(config, env, reload_config=lambda: resolve(args, env)) as sim:
            sim.demo(sys.stdout)
            if args.serve:
                sim.serve_until(stop, sys.stdout)
    except NvdpError as error:
        return _exit_on_error(error)
    finally:
        _remove_dir(plugin_dir)
    return 0


def _remove_dir(path: Path) -> None:
    shutil.rmtree(path / "mps", ignore_errors=True)
    for child in path.iterdir() if path.exists() else ():
        try:
            child.unlink()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
