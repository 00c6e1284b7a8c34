"""The simulated node: built-in profiles and YAML node files behind the NVML facade."""

from __future__ import annotations

from nvdp.node.nvml.sim.backend import SimNvml
from nvdp.node.nvml.sim.event_set import SimEventSet
from nvdp.node.nvml.sim.events import SimEventError
from nvdp.node.nvml.sim.node import SimGpu, SimNode
from nvdp.node.nvml.sim.spec import load_node_file, load_profile, profile_names

__all__ = [
    "SimEventError",
    "SimEventSet",
    "SimGpu",
    "SimNode",
    "SimNvml",
    "load_node_file",
    "load_profile",
    "open_sim",
    "profile_names",
]


def open_sim(target: str, events_path: str | None = None) -> SimNvml:
    """A simulated backend for a profile name ("dgx-a100") or a node file path (has "/" or ends .yaml).

    `events_path`: the fault-injection file to follow once init() is called (see $NVDP_SIM_EVENTS).
    """
    is_path = "/" in target or target.endswith((".yaml", ".yml"))
    node = load_node_file(target) if is_path else load_profile(target)
    return SimNvml(node, events_path=events_path)
