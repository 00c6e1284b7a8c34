"""`nvdp` command line. `nvidia-device-plugin` is `nvdp plugin`; `gpu-feature-discovery` is `nvdp gfd`.

This module is the only place that prints, installs signal handlers (through nvdp.signals, which
handles them) or chooses exit codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from nvdp import __version__
from nvdp.errors import ConfigError, NvdpError
from nvdp.logs import log_event, setup_logging
from nvdp.signals import SignalTarget, handle_signals

log = logging.getLogger("nvdp")

SIM_PROFILES = ("dgx-a100", "dgx-a100-mig", "pcie-4", "dgx-h100")
VERSION = f"nvdp {__version__}"


class Parser(argparse.ArgumentParser):
    """argparse with nvdp's error contract: a bad command line is one line on stderr (no usage
    dump), exit status 2. Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=VERSION)


def _parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    commands: Mapping[str, argparse.ArgumentParser] | None = None,
) -> argparse.Namespace:
    """parse_args, but an unknown argument is reported by the subcommand that got it."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        owner = (commands or {}).get(getattr(args, "command", ""), parser)
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    first = next(iter(sys.argv[1:] if argv is None else argv), None)
    if first == "plugin":
        from nvdp.ssl_block import block_ssl

        block_ssl()  # before anything imports grpc
    # Only the named command's parser: the plugin's start-up imports no other command's modules.
    parser, commands = build_parser(first if first in COMMANDS else None)
    args = _parse(parser, argv, commands)
    if args.command == "plugin":
        return run_plugin(args, os.environ)
    if args.command == "gfd":
        return run_gfd(args, os.environ)
    if args.command == "config-manager":
        return run_config_manager(args, os.environ)
    if args.command == "mps-control-daemon":
        return run_mps_control_daemon(args, os.environ)
    if args.command == "dra-kubelet-plugin":
        return run_dra_kubelet_plugin(args, os.environ)
    try:  # the commands that print: `nvdp simulate | head` is no traceback
        return run_config_check(args) if args.command == "config" else run_simulate(args, os.environ)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1


def build_parser(only: str | None = None) -> tuple[Parser, Mapping[str, argparse.ArgumentParser]]:
    """The `nvdp` parser, and each command's parser by its name (with `only`: that command's alone)."""
    parser = Parser(prog="nvdp", description="Kubernetes NVIDIA GPU device plugin.", allow_abbrev=False)
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text, add_arguments in (
        ("plugin", "run the device plugin daemon (same as nvidia-device-plugin)", _add_plugin_arguments),
        (
            "simulate",
            "run the plugin on a simulated GPU node against an in-process kubelet",
            _add_simulate_arguments,
        ),
        ("gfd", "label the node's GPUs for Node Feature Discovery", _add_gfd_arguments),
        (
            "mps-control-daemon",
            "run one MPS control daemon per MPS-shared resource (NVIDIA's mps-control-daemon)",
            _add_mps_arguments,
        ),
        ("dra-kubelet-plugin", "run the DRA kubelet plugin of the driver gpu.nvidia.com", _add_dra_arguments),
    ):
        if only in (None, name):
            command = sub.add_parser(name, help=help_text, allow_abbrev=False)
            _add_version(command)
            add_arguments(command)
    if only in (None, "config-manager", "config"):
        _add_config_manager_commands(sub)
    return parser, sub.choices


COMMANDS = tuple("plugin simulate gfd mps-control-daemon dra-kubelet-plugin config-manager config".split())


def _add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.dra.options import add_dra_flags

    add_dra_flags(parser)


def run_dra_kubelet_plugin(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp dra-kubelet-plugin`: the DRA kubelet plugin (see nvdp/dra)."""
    from nvdp.dra.driver import from_command_line

    try:
        driver = from_command_line(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    handle_signals().attach(SignalTarget(driver.request_stop, driver.request_reload, driver.abandon))
    driver.run()
    return 0


def _add_mps_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.mps.command import add_arguments

    add_arguments(parser)


def _nvidia_named(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace, Mapping[str, str]], int],
    argv: Sequence[str] | None,
) -> int:
    """One of NVIDIA's binary names as a console script: the same flags as the `nvdp` subcommand."""
    parser = Parser(prog=prog, description=description, allow_abbrev=False)
    _add_version(parser)
    add_arguments(parser)
    return run(_parse(parser, argv), os.environ)


def plugin_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `nvidia-device-plugin`: NVIDIA's binary name, same flags."""
    return _nvidia_named(
        "nvidia-device-plugin", "NVIDIA device plugin (nvdp).", _add_plugin_arguments, run_plugin, argv
    )


def mps_control_daemon_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `mps-control-daemon`: NVIDIA's binary name for `nvdp mps-control-daemon`."""
    from nvdp.mps.command import add_arguments

    return _nvidia_named(
        "mps-control-daemon", "NVIDIA MPS control daemon (nvdp).", add_arguments, run_mps_control_daemon, argv
    )


def gfd_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gpu-feature-discovery`: NVIDIA's binary name, same flags (the name the
    config-manager finds the process by: PROCESS_TO_SIGNAL)."""
    return _nvidia_named(
        "gpu-feature-discovery", "GPU feature discovery (nvdp gfd).", _add_gfd_arguments, run_gfd, argv
    )


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
    parser.add_argument("--api", choices=("device-plugin", "dra"), default="device-plugin", help="GPU API")
    add_plugin_flags(parser)


def _exit_on_error(error: NvdpError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 1


def run_plugin(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.ssl_block import block_ssl

    block_ssl()  # before grpc is imported; see nvdp/ssl_block.py
    from nvdp.config import resolve
    from nvdp.daemon import Daemon

    try:
        options = resolve(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    setup_logging(options.runtime.log_format, options.runtime.log_level)
    signals = handle_signals()  # before the daemon is built: a SIGTERM while it starts stops it too
    try:
        daemon = Daemon(options, reload_config=lambda: resolve(args, environ), environ=environ)
    except NvdpError as error:
        log_event(log, logging.ERROR, "cannot start", error=str(error))
        return 1
    signals.attach(SignalTarget(daemon.request_stop, daemon.request_reload, daemon.abandon))
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
    controller = prepared.controller
    handle_signals().attach(
        SignalTarget(controller.request_stop, controller.request_reload, controller.abandon)
    )
    try:
        controller.run(prepared.plans)
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1
    finally:
        prepared.nvml.shutdown()
    return 0


def run_simulate(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.config import resolve
    from nvdp.simulate import Simulation
    from nvdp.simulate_dra import DraSimulation

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
    if getattr(args, "cdi_spec_dir", None) is None and "CDI_SPEC_DIR" not in env:
        args.cdi_spec_dir = str(plugin_dir / "cdi")  # a demo leaves the host's /var/run/cdi alone
    try:
        options = resolve(args, env)
        from nvdp.mps.simulated import skip_daemon

        mps_note = skip_daemon(options.config)
    except NvdpError as error:
        _remove_dir(plugin_dir)
        return _exit_on_error(error)
    if mps_note:
        print(mps_note)
    level = options.runtime.log_level
    setup_logging(options.runtime.log_format, "warning" if level == "info" else level)
    stop = threading.Event()
    signals = handle_signals() if args.serve else None
    try:
        make = DraSimulation if args.api == "dra" else Simulation
        simulation = make(options, env, reload_config=lambda: resolve(args, env))
        if signals is not None:
            daemon = simulation.daemon
            signals.attach(SignalTarget(stop.set, daemon.request_reload, daemon.abandon))
        with simulation as sim:
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
    shutil.rmtree(path / "cdi", ignore_errors=True)
    for child in path.iterdir() if path.exists() else ():
        try:
            child.unlink()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


def _add_gfd_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.gfd.options import add_gfd_flags

    add_gfd_flags(parser)


def run_gfd(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp gfd`: NVIDIA's gpu-feature-discovery (see nvdp/gfd)."""
    from nvdp.gfd.options import resolve_gfd
    from nvdp.gfd.run import Gfd

    try:
        settings = resolve_gfd(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    setup_logging(settings.runtime.log_format, settings.runtime.log_level)
    log_event(log, logging.INFO, "gfd starting", config=settings.config.to_dict())
    gfd = Gfd(settings, reload_settings=lambda: resolve_gfd(args, environ))
    handle_signals().attach(SignalTarget(gfd.request_stop, gfd.request_reload, gfd.abandon))
    try:
        gfd.run()
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1
    return 0


# ---- config-manager and config check (nvdp/configmanager) ------------------------------------------


def _add_config_manager_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    from nvdp.config.options import add_options
    from nvdp.configmanager.check import CHECK_OPTIONS, CheckFlags
    from nvdp.configmanager.settings import add_flags

    manager = sub.add_parser(
        "config-manager",
        help="point the plugin's config file at the ConfigMap entry the node label selects",
        allow_abbrev=False,
    )
    _add_version(manager)
    add_flags(manager)
    config = sub.add_parser("config", help="config file tools", allow_abbrev=False)
    tools = config.add_subparsers(dest="config_command", required=True, metavar="TOOL")
    check = tools.add_parser(
        "check", help="strictly validate config files or ConfigMap entry directories", allow_abbrev=False
    )
    _add_version(check)
    check.add_argument("paths", nargs="+", metavar="FILE", help="config file, or a directory of entries")
    add_options(check, CHECK_OPTIONS, CheckFlags)


def run_config_manager(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.configmanager import command
    from nvdp.configmanager.manager import ConfigManager
    from nvdp.configmanager.settings import resolve

    try:
        settings = resolve(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    setup_logging(settings.log_format, settings.log_level)
    stop = threading.Event()
    try:
        if settings.oneshot:
            return command.oneshot(settings)
        managers: list[ConfigManager] = []

        def reconcile_now() -> bool:  # SIGHUP: True when that made a pass pending
            return any([manager.wake() for manager in managers])

        def stop_now() -> None:  # SIGTERM/SIGINT: the loop waits on inotify, wake it to stop
            stop.set()
            reconcile_now()

        handle_signals().attach(SignalTarget(stop_now, reconcile_now))
        return command.serve(settings, stop, managers)
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1


def run_config_check(args: argparse.Namespace) -> int:
    from nvdp.config.options import read_options, with_values
    from nvdp.configmanager.check import CHECK_OPTIONS, CheckFlags, check

    given, problems = read_options(CHECK_OPTIONS, args, {})
    if problems:
        return _exit_on_error(ConfigError(problems))
    flags = with_values(CheckFlags(), given)
    report = check(args.paths, nvml=flags.nvml, mig_strategy=flags.mig_strategy)
    for line in report.lines:
        print(line)
    for line in report.errors:
        print(f"error: {line}", file=sys.stderr)
    return report.status


if __name__ == "__main__":
    sys.exit(main())
