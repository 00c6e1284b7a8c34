"""What each `nvdp` command runs, once `nvdp.cli` has parsed its command line: resolve its settings,
set up logging, attach the signal handling (`nvdp.base.signals`) and run, mapping expected errors to one
line and an exit status. With `nvdp.cli`, the only place that prints or chooses exit codes.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from nvdp.base.errors import ConfigError, DirLockHeld, NvdpError
from nvdp.base.logs import log_event, setup_logging
from nvdp.base.signals import SignalTarget, handle_signals

log = logging.getLogger("nvdp")


def _exit_on_error(error: NvdpError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 1


def _keep_start_up() -> None:
    """The plugin's start-up makes what lives as long as the process (modules, classes, the daemon's
    parts): the garbage collector, off while they were made, would find next to nothing among them
    (a few hundred objects, kept now) and looks at them no more (`gc.freeze`). That is 2% of the CPU
    the plugin uses until it serves, and of every full collection after."""
    gc.freeze()
    gc.enable()


def run_plugin(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.base.ssl_block import block_ssl

    block_ssl()  # before grpc is imported; see nvdp/base/ssl_block.py
    gc.disable()  # until the daemon is built (see _keep_start_up)
    try:
        from nvdp.config import resolve
        from nvdp.plugins.deviceplugin.daemon import Daemon

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
    finally:
        _keep_start_up()
    signals.attach(SignalTarget(daemon.request_stop, daemon.request_reload, daemon.abandon))
    try:
        daemon.run()
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1
    return 0


def run_mps_control_daemon(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.node.mps.command import mount_shm, prepare

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
    import shutil
    import tempfile

    from nvdp.config import resolve
    from nvdp.sim.simulate import Simulation
    from nvdp.sim.simulate_dra import DraSimulation

    env = dict(environ)
    if args.profile is not None:
        args.nvml = f"sim:{args.profile}"
    elif getattr(args, "nvml", None) is None and not env.get("NVDP_NVML"):  # empty: unset
        args.nvml = "sim:dgx-a100"
    root = Path(tempfile.mkdtemp(prefix="nvdp-sim-", dir="/tmp"))  # a kubelet root of its own
    args.kubelet_socket = str(root / "device-plugins" / "kubelet.sock")
    if getattr(args, "metrics_address", None) is None:
        args.metrics_address = ""  # a demo should not take a port unless asked
    if getattr(args, "mps_root", None) is None and not env.get("MPS_ROOT"):
        args.mps_root = str(root / "mps")  # no MPS daemon runs here: see nvdp.node.mps.simulated
    if getattr(args, "cdi_spec_dir", None) is None and not env.get("CDI_SPEC_DIR"):
        args.cdi_spec_dir = str(root / "cdi")  # a demo leaves the host's /var/run/cdi alone
    try:
        options = resolve(args, env)
        from nvdp.node.mps.simulated import skip_daemon

        mps_note = skip_daemon(options.config)
    except NvdpError as error:
        shutil.rmtree(root, ignore_errors=True)
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
        shutil.rmtree(root, ignore_errors=True)
    return 0


def run_status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp status`: the node's allocations, from the plugin's /allocations (see
    nvdp/plugins/ledger/status.py)."""
    from nvdp.config.options import read_options, with_values
    from nvdp.plugins.ledger.report import describe_allocations
    from nvdp.plugins.ledger.status import STATUS_OPTIONS, StatusFlags, allocations_url, read_allocations

    given, problems = read_options(STATUS_OPTIONS, args, environ)
    if problems:
        return _exit_on_error(ConfigError(problems))
    flags = with_values(StatusFlags(), given)
    try:
        url = allocations_url(flags.metrics_address)
        document = read_allocations(url)
    except NvdpError as error:
        return _exit_on_error(error)
    print(f"nvdp status: {url}")
    print(describe_allocations(document), end="")
    return 0


def run_gfd(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp gfd`: NVIDIA's gpu-feature-discovery (see nvdp/side/gfd)."""
    from nvdp.side.gfd.options import resolve_gfd
    from nvdp.side.gfd.run import Gfd

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


def run_config_manager(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvdp.plugins.uninstall import release_from_env
    from nvdp.side.configmanager import command
    from nvdp.side.configmanager.manager import ConfigManager
    from nvdp.side.configmanager.settings import resolve

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
        release = release_from_env(environ, kubeconfig=settings.kubeconfig or "")
        return command.serve(settings, stop, managers, release)
    except NvdpError as error:
        log_event(log, logging.ERROR, "exiting", error=str(error))
        return 1


def run_delete_daemonsets(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp delete-daemonsets`: the chart's pre-delete hook (`nvdp.plugins.uninstall.delete_daemonsets`). 0
    unless its settings are bad or no API client can be built: a DaemonSet left is said, and the
    uninstall goes on."""
    from nvdp import kube
    from nvdp.plugins.uninstall import delete_daemonsets, resolve_delete_daemonsets

    try:
        flags = resolve_delete_daemonsets(args, environ)
    except ConfigError as error:
        return _exit_on_error(error)
    setup_logging("text", "info")
    try:
        client = kube.new_api_client(kubeconfig=flags.kubeconfig or None)
    except NvdpError as error:
        return _exit_on_error(error)
    delete_daemonsets(client, flags.namespace, args.names, deadline_s=flags.wait)
    return 0


def run_config_check(args: argparse.Namespace) -> int:
    from nvdp.config.options import read_options, with_values
    from nvdp.side.configmanager.check import CHECK_OPTIONS, CheckFlags, check

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


def run_dra_kubelet_plugin(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`nvdp dra-kubelet-plugin`: the DRA kubelet plugin (see nvdp/plugins/dra). One per node: the plugin
    directory is claimed first (a second plugin there exits 1, naming the holder's pid), and held
    while what an uninstall leaves is cleaned up (`nvdp.plugins.uninstall`)."""
    from nvdp.plugins.dra.driver import from_command_line
    from nvdp.plugins.dra.names import CHECKPOINT_FILE, PLUGIN_LOCK_FILE
    from nvdp.plugins.kubeletplugin.dir_lock import DirClaim
    from nvdp.plugins.uninstall import clean_up_dra_node, release_from_env

    try:
        driver = from_command_line(args, environ)
    except NvdpError as error:
        return _exit_on_error(error)
    claim = DirClaim(
        driver.settings.plugin_dir, fail_if_held=True, what="DRA plugin directory", lock_name=PLUGIN_LOCK_FILE
    )
    stop = threading.Event()  # a stop while the directory cannot be claimed yet

    def stop_now() -> None:
        stop.set()
        driver.request_stop()

    def abandon() -> None:
        driver.abandon()
        claim.release()

    handle_signals().attach(SignalTarget(stop_now, driver.request_reload, abandon))
    try:
        claimed = claim.acquire(stop)
        if claimed:
            driver.run(claim.refresh)
            release = release_from_env(environ, kubeconfig=driver.settings.kubeconfig)
            prepared = driver.preparer is None or bool(driver.preparer.prepared)
            clean_up_dra_node(release, driver.handoff, driver.settings.plugin_dir / CHECKPOINT_FILE, prepared)
    except DirLockHeld as error:  # at start, or taken by another while the directory was gone
        return _exit_on_error(error)
    finally:
        claim.release()
    return 0
