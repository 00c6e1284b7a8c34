"""From NVML facts and config to the resources the plugin advertises (pure).

Follows NVIDIA's device-plugin rules:
- MIG strategy `none`: every GPU (MIG-enabled or not) is matched against `resources.gpus`.
- `single`: MIG-enabled GPUs are skipped as whole GPUs and their MIG devices are advertised
  (default name `nvidia.com/gpu`); all MIG devices must be of one profile and the node may not mix
  MIG-enabled and MIG-disabled GPUs.
- `mixed`: whole GPUs as `nvidia.com/gpu`, MIG devices as `nvidia.com/mig-<profile>`.
Every GPU / MIG device must match a pattern; every MIG-enabled GPU must have MIG devices.
Sharing (time-slicing, MPS) then replaces a resource's devices by replicas `<uuid>::<n>`, under the
same name or a `rename`. Several sharing entries may name one resource when their `devices`
selections are disjoint, each with its own `replicas` (per-GPU replica counts under one name);
devices no entry selects stay whole under the unshared name; `replicas: 1` keeps a device whole
(no `::` ID). An entry whose name is no resource of the node is refused, naming the node's resources.
The device records come from `nvdp.devices`; a list over the kubelet's message limit is refused
(`nvdp.list_size`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nvdp.devices import AnnotatedID, Device, DeviceSet, gpu_device, mig_device
from nvdp.errors import ConfigError
from nvdp.errors import ResourceError as ResourceError  # defined in nvdp.errors; importers use either
from nvdp.list_size import check_list_sizes
from nvdp.nvml.types import GpuInfo

DEFAULT_PREFIX = "nvidia.com/"
MIG_STRATEGIES = ("none", "single", "mixed")


@dataclass(frozen=True)
class NamePattern:
    """One `resources.gpus` / `resources.mig` entry: a glob over product / profile names."""

    pattern: str
    name: str  # fully qualified, e.g. nvidia.com/gpu

    def matches(self, value: str) -> bool:
        return fnmatch.fnmatchcase(value, self.pattern)


@dataclass(frozen=True)
class Replication:
    """One `sharing.<strategy>.resources` entry."""

    name: str  # the resource whose devices are shared
    replicas: int
    rename: str | None = None
    devices: str | int | tuple[str, ...] = "all"  # "all", a count, or indices / uuids
    strategy: str = "time-slicing"  # or "mps"
    fail_requests_greater_than_one: bool = False


@dataclass(frozen=True)
class Resource:
    """One resource name served by one gRPC device plugin.

    `replica_counts` maps each shared unit (GPU or MIG uuid) to its replica count; units not in it
    are whole (one device). `replicas` is the count of every shared unit when they agree, else the
    smallest. `allocation_policy` (NVIDIA's sharedDevicesAllocationPolicy) is set on resources of
    replicas or MIG devices, the ones it applies to; None on whole GPUs.
    """

    name: str
    devices: DeviceSet
    sharing: str | None = None  # "time-slicing" | "mps" | None
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
    replica_counts: Mapping[str, int] = field(default_factory=dict)
    allocation_policy: str | None = None

    def replicas_of(self, uuid: str) -> int:
        """How many devices of this resource the GPU or MIG device `uuid` is advertised as."""
        return self.replica_counts.get(uuid, 1)

    @property
    def short_name(self) -> str:
        return self.name.rpartition("/")[2]

    @property
    def socket_name(self) -> str:
        """The plugin's socket file in the kubelet's device-plugin dir: nvidia-<name>.sock."""
        return f"nvidia-{self.short_name}.sock"

    def signature(self) -> tuple[object, ...]:
        """What a config reload compares to decide whether the server must restart."""
        return (
            self.name,
            tuple(self.devices.values()),
            self.sharing,
            self.replicas,
            self.fail_requests_greater_than_one,
            tuple(sorted(self.replica_counts.items())),
            self.allocation_policy,
        )


def qualify(name: str) -> str:
    """Add the default `nvidia.com/` prefix to a bare resource name."""
    return name if "/" in name else DEFAULT_PREFIX + name


def default_gpu_patterns() -> list[NamePattern]:
    return [NamePattern("*", DEFAULT_PREFIX + "gpu")]


def default_mig_patterns(strategy: str, gpus: Sequence[GpuInfo]) -> list[NamePattern]:
    if strategy == "single":
        return [NamePattern("*", DEFAULT_PREFIX + "gpu")]
    if strategy == "mixed":
        profiles = sorted({m.profile for g in gpus for m in g.mig_devices})
        return [NamePattern(p, mig_resource_name(p)) for p in profiles]
    return []


def mig_resource_name(profile: str) -> str:
    """NVIDIA's default name under MIG strategy mixed: `nvidia.com/mig-<profile>` with `+` as `.`, since
    a resource name is a DNS subdomain (`1g.5gb+me` -> `nvidia.com/mig-1g.5gb.me`)."""
    return f"{DEFAULT_PREFIX}mig-{profile.replace('+', '.')}"


def build_resources(
    gpus: Sequence[GpuInfo],
    *,
    mig_strategy: str = "none",
    gpu_patterns: Sequence[NamePattern] = (),
    mig_patterns: Sequence[NamePattern] = (),
    sharing: Sequence[Replication] = (),
    mig_minors: Mapping[str, int] | None = None,
    allocation_policy: str = "distributed",
) -> list[Resource]:
    """Map the node's GPUs onto resources. Raises ResourceError with every problem found."""
    if mig_strategy not in MIG_STRATEGIES:
        raise ConfigError(
            f"flags.migStrategy: invalid value {mig_strategy!r} (accepted: none, single, mixed)"
        )
    gpu_patterns = list(gpu_patterns) or default_gpu_patterns()
    mig_patterns = list(mig_patterns) or default_mig_patterns(mig_strategy, gpus)
    problems: list[str] = []
    by_name: dict[str, list[Device]] = {}

    def add(name: str, device: Device) -> None:
        by_name.setdefault(name, []).append(device)

    for gpu in gpus:
        if gpu.mig_enabled and mig_strategy != "none":
            continue
        match = next((p for p in gpu_patterns if p.matches(gpu.name)), None)
        if match is None:
            problems.append(f"GPU {gpu.index} name {gpu.name!r} does not match any resources.gpus pattern")
            continue
        add(match.name, gpu_device(gpu))

    if mig_strategy != "none":
        whole = [g for g in gpus if not g.mig_enabled]
        migs = [g for g in gpus if g.mig_enabled]
        for gpu in migs:
            if not gpu.mig_devices:
                problems.append(f"GPU {gpu.index} has MIG enabled but no MIG devices configured")
        if mig_strategy == "single":
            if whole and migs:
                problems.append(
                    "mig-strategy single: all GPUs must have the same MIG mode "
                    f"(MIG enabled on {_indices(migs)}, disabled on {_indices(whole)})"
                )
            profiles = sorted({m.profile for g in migs for m in g.mig_devices})
            if len(profiles) > 1:
                problems.append(
                    f"mig-strategy single: more than one MIG profile on the node ({', '.join(profiles)})"
                )
        for gpu in migs:
            for mig in gpu.mig_devices:
                match = next((p for p in mig_patterns if p.matches(mig.profile)), None)
                if match is None:
                    problems.append(
                        f"MIG device {gpu.index}:{mig.index} profile {mig.profile!r} "
                        "does not match any resources.mig pattern"
                    )
                    continue
                add(match.name, mig_device(gpu, mig, mig_minors))
    if problems:
        raise ResourceError("; ".join(problems))

    resources = {name: Resource(name, DeviceSet(devs)) for name, devs in by_name.items()}
    built = [_with_policy(r, allocation_policy) for r in _apply_sharing(resources, sharing)]
    check_list_sizes(built)
    return built


def _with_policy(resource: Resource, policy: str) -> Resource:
    devices = resource.devices.values()
    if any(d.replica is not None or d.is_mig for d in devices):
        return replace(resource, allocation_policy=policy)
    return resource


def _indices(gpus: Sequence[GpuInfo]) -> str:
    return ",".join(str(g.index) for g in gpus)


def _entry(rule: Replication, i: int) -> str:
    """The config path of sharing entry i: `sharing.timeSlicing.resources[i]`."""
    section = "mps" if rule.strategy == "mps" else "timeSlicing"
    return f"sharing.{section}.resources[{i}]"


def _select_shared(resource: Resource, rule: Replication, entry: str) -> list[Device]:
    devices = list(resource.devices.values())
    if rule.devices == "all":
        return devices
    if isinstance(rule.devices, int):
        if rule.devices > len(devices):
            raise ResourceError(
                f"{entry}: {rule.name}: {rule.devices} devices requested to be shared, "
                f"but only {len(devices)} available"
            )
        return devices[: rule.devices]
    chosen: list[Device] = []
    for ref in rule.devices:
        found = next((d for d in devices if ref in (d.uuid, d.index)), None)
        if found is None:
            raise ResourceError(f"{entry}: {rule.name}: no device with index or UUID {ref!r}")
        if found not in chosen:
            chosen.append(found)
    return chosen


def _device_names(devices: Sequence[Device]) -> str:
    whole = [d.index for d in devices if not d.is_mig]
    migs = [d.index for d in devices if d.is_mig]
    parts = []
    if whole:
        parts.append(("GPU " if len(whole) == 1 else "GPUs ") + ", ".join(whole))
    if migs:
        parts.append(("MIG device " if len(migs) == 1 else "MIG devices ") + ", ".join(migs))
    return " and ".join(parts)


def _apply_sharing(resources: dict[str, Resource], sharing: Sequence[Replication]) -> list[Resource]:
    out: dict[str, list[Device]] = {n: list(r.devices.values()) for n, r in resources.items()}
    meta: dict[str, Replication] = {}
    counts: dict[str, dict[str, int]] = {}
    claimed: dict[str, tuple[int, str]] = {}  # device id -> (entry index, entry path)
    problems: list[str] = []
    for i, rule in enumerate(sharing):
        entry = _entry(rule, i)
        source = resources.get(rule.name)
        if source is None:
            problems.append(
                f"{entry}: {rule.name} matches no resource on this node "
                f"(it could match: {', '.join(sorted(resources)) or 'none, the node has no devices'})"
            )
            continue
        shared = _select_shared(source, rule, entry)
        overlap: dict[str, list[Device]] = {}
        for device in shared:
            if device.id in claimed:
                overlap.setdefault(claimed[device.id][1], []).append(device)
        for other, both in overlap.items():
            problems.append(
                f"{entry}: selects {_device_names(both)} of {rule.name}, also selected by {other}; "
                "entries with the same name need disjoint devices"
            )
        if overlap:
            continue
        claimed.update({d.id: (i, entry) for d in shared})
        shared_ids = {d.id for d in shared}
        out[rule.name] = [d for d in out[rule.name] if d.id not in shared_ids]
        target = rule.rename or rule.name
        members = out.setdefault(target, [])
        for device in shared:
            if rule.replicas == 1:
                members.append(device)
                continue
            counts.setdefault(target, {})[device.uuid] = rule.replicas
            for n in range(rule.replicas):
                members.append(replace(device, id=str(AnnotatedID(device.uuid, n)), replica=n))
        if rule.replicas > 1:
            meta[target] = rule
    if problems:
        raise ResourceError("; ".join(problems))
    result: list[Resource] = []
    for name, devices in out.items():
        if not devices:
            continue
        rule_for = meta.get(name)
        if rule_for is None:
            result.append(Resource(name, DeviceSet(sorted(devices, key=_device_order))))
        else:
            per_unit = counts[name]
            result.append(
                Resource(
                    name,
                    DeviceSet(sorted(devices, key=_device_order)),
                    sharing=rule_for.strategy,
                    replicas=min(per_unit.values()),
                    fail_requests_greater_than_one=rule_for.fail_requests_greater_than_one,
                    replica_counts=per_unit,
                )
            )
    result.sort(key=lambda r: r.name)
    return result


def _device_order(device: Device) -> tuple[int, int, int]:
    mig = device.mig.index if device.mig is not None else -1
    return (device.gpu_index, mig, device.replica if device.replica is not None else -1)
