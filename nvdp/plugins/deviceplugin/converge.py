"""The supervisor's reload decision (pure): from the servers that run and the resources wanted now, which
servers to update in place, restart, start and stop. The supervisor only carries the plan out.

A server whose resource changed but whose Allocate options did not is updated in place (its new device
list goes out on the open ListAndWatch stream; registration and stream are kept). Changed options
(device-list strategy, CDI names, control devices, ...) need a new server. Resources that are no longer
wanted stop; new ones start.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerPlan:
    update: tuple[str, ...] = ()  # same server, new devices
    restart: tuple[str, ...] = ()  # stopped, then started with the new resource and options
    start: tuple[str, ...] = ()  # new resources
    stop: tuple[str, ...] = ()  # resources no longer served


def plan_servers(
    running: Mapping[str, tuple[Hashable, Hashable]],
    wanted: Mapping[str, Hashable],
    options: Hashable,
) -> ServerPlan:
    """`running`: resource -> (its resource signature, its options); `wanted`: resource -> signature;
    `options`: the options every server is to have. Names come out in the order of their mapping."""
    update, restart, stop = [], [], []
    for name, (signature, server_options) in running.items():
        if name not in wanted:
            stop.append(name)
        elif server_options != options:
            restart.append(name)
        elif wanted[name] != signature:
            update.append(name)
    start = [name for name in wanted if name not in running]
    return ServerPlan(tuple(update), tuple(restart), tuple(start), tuple(stop))
