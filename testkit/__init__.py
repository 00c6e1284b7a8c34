"""Helpers for the test suite and the benchmarks: the plugin (and the DRA kubelet plugin) as a real
process, /proc readings, files that make large device sets, short directories for unix sockets. Not
used by the plugin itself (it never imports this package)."""

from testkit.dirs import short_temp_dir
from testkit.dra import DraNode, start_dra_plugin
from testkit.nodes import append_sim_event, sim_gpus, write_node_file, write_time_slicing_config
from testkit.processes import (
    REPO,
    Process,
    clean_env,
    free_port,
    http_get,
    plugin_argv,
    start_plugin,
    wait_until,
)
from testkit.procfs import ProcStats

__all__ = [
    "REPO",
    "DraNode",
    "ProcStats",
    "Process",
    "clean_env",
    "append_sim_event",
    "free_port",
    "http_get",
    "plugin_argv",
    "short_temp_dir",
    "sim_gpus",
    "start_dra_plugin",
    "start_plugin",
    "wait_until",
    "write_node_file",
    "write_time_slicing_config",
]
