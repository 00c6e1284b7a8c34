"""`nvdp` command line. `nvidia-device-plugin` is `nvdp plugin`; `gpu-feature-discovery` is `nvdp gfd`;
`gpu-kubelet-plugin` is `nvdp dra-kubelet-plugin`.

This module builds the command lines and dispatches; what each command runs is `nvdp.commands`. The
two are the only places that print, install signal handlers (through nvdp.base.signals, which handles
them) or choose exit codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from nvdp import __version__
from nvdp.base.errors import ConfigError
from nvdp.base.timers import check as check_timers
from nvdp.commands import (
    run_config_check,
    run_config_manager,
    run_delete_daemonsets,
    run_dra_kubelet_plugin,
    run_gfd,
    run_mps_control_daemon,
    run_plugin,
    run_simulate,
    run_status,
)

log = logging.getLogger("nvdp")

SIM_PROFILES = ("dgx-a100", "dgx-a100-mig", "dgx-a100-mig-empty", "pcie-4", "dgx-h100")


VERSION = f"nvdp {__version__}"


class Parser(argparse.ArgumentParser):
    """argparse with nvdp's error contract: a bad command line is one line on stderr (no usage
    dump), exit status 2. Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", "-v", action="version", version=VERSION)  # urfave/cli's names


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
        from nvdp.base.ssl_block import block_ssl

        block_ssl()  # before anything imports grpc
    # Only the named command's parser: the plugin's start-up imports no other command's modules.
    parser, commands = build_parser(first if first in COMMANDS else None)
    args = _parse(parser, argv, commands)
    try:
        check_timers(os.environ)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    _log_as_given(args, os.environ)
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
    if args.command == "delete-daemonsets":
        return run_delete_daemonsets(args, os.environ)
    try:  # the commands that print: `nvdp simulate | head` is no traceback
        if args.command == "status":
            return run_status(args, os.environ)
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
        (
            "status",
            "print which pods hold this node's devices (the plugin's /allocations)",
            _add_status_arguments,
        ),
        ("dra-kubelet-plugin", "run the DRA kubelet plugin of the driver gpu.nvidia.com", _add_dra_arguments),
        (
            "delete-daemonsets",
            "delete DaemonSets in the foreground and wait for their pods (the chart's uninstall hook)",
            _add_delete_daemonsets_arguments,
        ),
    ):
        if only in (None, name):
            command = sub.add_parser(name, help=help_text, allow_abbrev=False)
            _add_version(command)
            add_arguments(command)
    if only in (None, "config-manager", "config"):
        _add_config_manager_commands(sub)
    return parser, sub.choices


COMMANDS = tuple(
    "plugin simulate gfd mps-control-daemon dra-kubelet-plugin status config-manager config"
    " delete-daemonsets".split()
)


def _add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.plugins.dra.options import add_dra_flags

    add_dra_flags(parser)


def _add_mps_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.node.mps.command import add_arguments

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
    args = _parse(parser, argv)
    _log_as_given(args, os.environ)
    return run(args, os.environ)


def _log_as_given(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Logging set up as the command's --log-format / --log-level (or their env vars) say, before its
    settings are resolved: what resolving logs (a config file's unknown keys) is then a line like every
    other, JSON under `--log-format json`. Only flags and env vars set these, never the config file;
    a bad value leaves the default here and is reported by the resolve that follows."""
    if not hasattr(args, "log_format"):
        return  # a command that prints (status, config check)
    from nvdp.base.logs import setup_logging
    from nvdp.config.groups import LOGGING
    from nvdp.config.options import read_options

    given, problems = read_options(LOGGING, args, environ)
    if not problems:
        setup_logging(str(given.get("log_format", "text")), str(given.get("log_level", "info")))


def plugin_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `nvidia-device-plugin`: NVIDIA's binary name, same flags."""
    return _nvidia_named(
        "nvidia-device-plugin", "NVIDIA device plugin (nvdp).", _add_plugin_arguments, run_plugin, argv
    )


def mps_control_daemon_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `mps-control-daemon`: NVIDIA's binary name for `nvdp mps-control-daemon`."""
    from nvdp.node.mps.command import add_arguments

    return _nvidia_named(
        "mps-control-daemon", "NVIDIA MPS control daemon (nvdp).", add_arguments, run_mps_control_daemon, argv
    )


def gfd_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gpu-feature-discovery`: NVIDIA's binary name, same flags (the name the
    config-manager finds the process by: PROCESS_TO_SIGNAL)."""
    return _nvidia_named(
        "gpu-feature-discovery", "GPU feature discovery (nvdp gfd).", _add_gfd_arguments, run_gfd, argv
    )


def config_manager_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `config-manager`: NVIDIA's binary name for `nvdp config-manager`, same flags."""
    from nvdp.side.configmanager.settings import add_flags

    return _nvidia_named(
        "config-manager",
        "Node label -> config file (nvdp config-manager).",
        add_flags,
        run_config_manager,
        argv,
    )


def dra_kubelet_plugin_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gpu-kubelet-plugin`: the binary name of NVIDIA's DRA driver for `nvdp
    dra-kubelet-plugin` (the name the config-manager finds the process by: PROCESS_TO_SIGNAL)."""
    return _nvidia_named(
        "gpu-kubelet-plugin",
        "DRA kubelet plugin of the driver gpu.nvidia.com (nvdp dra-kubelet-plugin).",
        _add_dra_arguments,
        run_dra_kubelet_plugin,
        argv,
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


def _add_delete_daemonsets_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.config.options import add_options
    from nvdp.plugins.uninstall import DELETE_DAEMONSETS_OPTIONS, DeleteDaemonSetsFlags

    parser.add_argument("names", nargs="+", metavar="DAEMONSET", help="the DaemonSets to delete")
    add_options(parser, DELETE_DAEMONSETS_OPTIONS, DeleteDaemonSetsFlags)


def _add_status_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.config.options import add_options
    from nvdp.plugins.ledger.status import STATUS_OPTIONS, StatusFlags

    add_options(parser, STATUS_OPTIONS, StatusFlags)


def _add_gfd_arguments(parser: argparse.ArgumentParser) -> None:
    from nvdp.side.gfd.options import add_gfd_flags

    add_gfd_flags(parser)


def _add_config_manager_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    from nvdp.config.options import add_options
    from nvdp.side.configmanager.check import CHECK_OPTIONS, CheckFlags
    from nvdp.side.configmanager.settings import add_flags

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


if __name__ == "__main__":
    sys.exit(main())
