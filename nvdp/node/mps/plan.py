"""MPS rules over plain data (pure): the daemons a node needs, their limits and per-container limits
(what MPS refuses: of a config, `nvdp.config.rules`; of a node, `nvdp.node.gpus.inventory`).

- Defaults, as NVIDIA's control daemon: pinned memory per GPU is its memory / replicas (MiB,
  `<n>M`); active threads are 100 / replicas percent.
- A container's own limits match the replicas it got: 2 of 4 replicas of a GPU may use half of
  it, never more.
- Replica counts are per GPU (`Resource.replicas_of`); memory and container limits use each GPU's
  count; the daemon's one thread percentage is its most divided GPU's share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvdp.base.units import MIB
from nvdp.config.model import MPS
from nvdp.node.gpus.devices import Device
from nvdp.node.gpus.resources import Resource

from .layout import PINNED_MEM_LIMIT_ENV, THREAD_PERCENTAGE_ENV


@dataclass(frozen=True)
class GpuShare:
    """One GPU under an MPS daemon and the replicas it is cut into."""

    uuid: str
    index: int
    memory_bytes: int
    replicas: int

    @property
    def pinned_mem_limit(self) -> str:
        return f"{self.memory_bytes // self.replicas // MIB}M"


@dataclass(frozen=True)
class DaemonPlan:
    """What one MPS control daemon serves: one resource's GPUs."""

    resource: str
    gpus: tuple[GpuShare, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    def limit_commands(self) -> list[str]:
        """The commands sent through the control pipe after `-d`, in order."""
        commands = [
            f"set_default_device_pinned_mem_limit {g.index} {g.pinned_mem_limit}"
            for g in self.gpus
            if g.memory_bytes
        ]
        if self.gpus:
            replicas = max(g.replicas for g in self.gpus)
            commands.append(f"set_default_active_thread_percentage {100 // replicas}")
        return commands


def daemon_plans(resources: Sequence[Resource]) -> dict[str, DaemonPlan]:
    """One plan per MPS-shared resource, GPUs in index order, each with its own replica count."""
    plans: dict[str, DaemonPlan] = {}
    for resource in resources:
        if resource.sharing != MPS:
            continue
        shares: dict[str, GpuShare] = {}
        for device in resource.devices.values():
            if device.replica is None:  # a GPU left unshared under the same name (a device subset)
                continue
            shares[device.gpu_uuid] = GpuShare(
                device.gpu_uuid,
                device.gpu_index,
                device.memory_bytes,
                resource.replicas_of(device.uuid),
            )
        gpus = tuple(sorted(shares.values(), key=lambda g: g.index))
        plans[resource.name] = DaemonPlan(resource.name, gpus)
    return plans


def container_limit_envs(devices: Sequence[Device], replicas_of: Callable[[str], int]) -> dict[str, str]:
    """Per-container limits for the replicas one container received: the pinned-memory limit per
    device ordinal (the order the container sees its GPUs in) and one thread percentage (the
    smallest share over its GPUs). `replicas_of(uuid)` is that GPU's replica count
    (`Resource.replicas_of`); a whole GPU (1) is given whole."""
    given: dict[str, list[Device]] = {}
    for device in devices:
        given.setdefault(device.uuid, []).append(device)
    if not given:
        return {}
    memory = []
    percentages = []
    for ordinal, (uuid, same) in enumerate(given.items()):
        replicas = max(1, replicas_of(uuid))
        count = replicas if same[0].replica is None else min(len(same), replicas)
        if same[0].memory_bytes:
            memory.append(f"{ordinal}={same[0].memory_bytes * count // replicas // MIB}M")
        percentages.append(100 * count // replicas)
    envs = {THREAD_PERCENTAGE_ENV: str(min(percentages))}
    if memory:
        envs[PINNED_MEM_LIMIT_ENV] = ",".join(memory)
    return envs
