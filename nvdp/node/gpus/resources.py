"""From NVML facts and config to the resources the plugin advertises (pure), by NVIDIA's rules.

- MIG strategy `none`: every GPU is matched against `resources.gpus`; `single`: MIG-enabled GPUs as
  their MIG devices (default `nvidia.com/gpu`); `mixed`: GPUs as `nvidia.com/gpu`, MIG devices as
  `nvidia.com/mig-<profile>`. Device records come from `nvdp.node.gpus.devices`.
- Sharing replaces a resource's devices by replicas `<uuid>::<n>`, under its name or a `rename`;
  entries with disjoint `devices` may share a name, each with its `replicas`; unselected devices
  stay whole; `replicas: 1` keeps a device whole (no `::`).
- Left out and named in a `Misfit` (the rest is served): a device no `resources.gpus` / `.mig`
  pattern matches; a MIG-enabled GPU without MIG devices yet; under `single`, the whole GPUs of a
  mixed node and all MIG profiles but the most common (tie: first by name); a sharing entry naming no
  resource here or devices an earlier same-name entry selected (one naming absent devices shares
  those present); a resource whose ListAndWatch list exceeds the kubelet's limit (`nvdp.node.gpus.list_size`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nvdp.base.errors import ConfigError
from nvdp.config.model import MIG_STRATEGIES, MPS, NamePattern, ReplicatedResource
from nvdp.node.gpus.devices import AnnotatedID, Device, DeviceSet, device_names, gpu_device, mig_device
from nvdp.node.gpus.list_size import oversized
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.nvml.types import GpuInfo

DEFAULT_PREFIX = "nvidia.com/"


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
    sharing: str | None = None  # TIME_SLICING | MPS | None
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


@dataclass(frozen=True)
class NodeResources:
    """What a node serves under a config: its resources, and the misfits (node facts that kept part of
    the config from applying here, each naming what was left out)."""

    resources: list[Resource]
    misfits: tuple[Misfit, ...] = ()


def build_resources(
    gpus: Sequence[GpuInfo],
    *,
    mig_strategy: str = "none",
    gpu_patterns: Sequence[NamePattern] = (),
    mig_patterns: Sequence[NamePattern] = (),
    sharing: Sequence[ReplicatedResource] = (),
    mig_minors: Mapping[str, int] | None = None,
    allocation_policy: str = "distributed",
) -> NodeResources:
    """Map the node's GPUs onto resources; what does not fit the config is left out as a misfit.
    Raises ConfigError only for an unknown MIG strategy (the config's form)."""
    if mig_strategy not in MIG_STRATEGIES:
        raise ConfigError(
            f"flags.migStrategy: invalid value {mig_strategy!r} (accepted: none, single, mixed)"
        )
    gpu_patterns = list(gpu_patterns) or default_gpu_patterns()
    mig_patterns = list(mig_patterns) or default_mig_patterns(mig_strategy, gpus)
    misfits: list[Misfit] = []
    by_name: dict[str, list[Device]] = {}

    def add(name: str, device: Device) -> None:
        by_name.setdefault(name, []).append(device)

    migs = [g for g in gpus if g.mig_enabled and mig_strategy != "none"]
    whole = [g for g in gpus if g not in migs]
    if mig_strategy != "none":
        for gpu in migs:
            if not gpu.mig_devices:
                misfits.append(
                    Misfit(
                        "MigWithoutDevices",
                        f"GPU {gpu.index}",
                        f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG devices yet; not "
                        "advertised until they are created",
                    )
                )
        migs = [g for g in migs if g.mig_devices]
    if mig_strategy == "single" and migs and whole:
        misfits.append(
            Misfit(
                "MigModeMixed",
                f"GPUs {_indices(whole)}",
                "mig-strategy single: GPUs "
                f"{_indices(whole)} have MIG disabled while {_indices(migs)} have MIG enabled; serving "
                "the MIG devices, the whole GPUs are not advertised",
            )
        )
        whole = []
    for gpu in whole:
        match = next((p for p in gpu_patterns if p.matches(gpu.name)), None)
        if match is None:
            misfits.append(
                Misfit(
                    "DeviceUnmatched",
                    f"GPU {gpu.index}",
                    f"GPU {gpu.index} name {gpu.name!r} matches no resources.gpus pattern; not advertised",
                )
            )
            continue
        add(match.name, gpu_device(gpu))
    served_profile = _single_profile(migs, misfits) if mig_strategy == "single" else None
    for gpu in migs:
        for mig in gpu.mig_devices:
            if served_profile is not None and mig.profile != served_profile:
                continue
            match = next((p for p in mig_patterns if p.matches(mig.profile)), None)
            if match is None:
                misfits.append(
                    Misfit(
                        "DeviceUnmatched",
                        f"MIG device {gpu.index}:{mig.index}",
                        f"MIG device {gpu.index}:{mig.index} profile {mig.profile!r} matches no "
                        "resources.mig pattern; not advertised",
                    )
                )
                continue
            add(match.name, mig_device(gpu, mig, mig_minors))

    resources = {name: Resource(name, DeviceSet(devs)) for name, devs in by_name.items()}
    built = [_with_policy(r, allocation_policy) for r in _apply_sharing(resources, sharing, misfits)]
    too_big = oversized(built)
    for name, why in too_big.items():
        misfits.append(Misfit("DeviceListTooLarge", name, f"{why}; not advertised", withholds=(name,)))
    return NodeResources([r for r in built if r.name not in too_big], tuple(misfits))


def _single_profile(migs: Sequence[GpuInfo], misfits: list[Misfit]) -> str | None:
    """Under `single`: the MIG profile to serve (the one most MIG devices have; first by name on a
    tie), with a misfit naming the MIG devices of other profiles."""
    counts: dict[str, int] = {}
    for mig in (m for g in migs for m in g.mig_devices):
        counts[mig.profile] = counts.get(mig.profile, 0) + 1
    if not counts:
        return None
    served = min(counts, key=lambda profile: (-counts[profile], profile))
    if len(counts) > 1:
        others = sorted(p for p in counts if p != served)
        misfits.append(
            Misfit(
                "MigProfilesMixed",
                "profiles " + ", ".join(others),
                f"mig-strategy single: more than one MIG profile on the node ({', '.join(sorted(counts))}); "
                f"serving {served}, MIG devices of {', '.join(others)} are not advertised",
            )
        )
    return served


def _with_policy(resource: Resource, policy: str) -> Resource:
    devices = resource.devices.values()
    if any(d.replica is not None or d.is_mig for d in devices):
        return replace(resource, allocation_policy=policy)
    return resource


def _indices(gpus: Sequence[GpuInfo]) -> str:
    return ",".join(str(g.index) for g in gpus)


def _entry(rule: ReplicatedResource, i: int) -> str:
    """The config path of sharing entry i: `sharing.timeSlicing.resources[i]`."""
    section = "mps" if rule.strategy == MPS else "timeSlicing"
    return f"sharing.{section}.resources[{i}]"


def _select_shared(
    resource: Resource, rule: ReplicatedResource, entry: str, misfits: list[Misfit]
) -> list[Device]:
    """The devices of `resource` the entry selects; a selection beyond this node's devices shares
    those it has, with a misfit naming what is missing."""
    devices = list(resource.devices.values())
    if rule.devices == "all":
        return devices
    if isinstance(rule.devices, int):
        if rule.devices > len(devices):
            misfits.append(
                Misfit(
                    "SharingDevicesMissing",
                    entry,
                    f"{entry}: {rule.name}: {rule.devices} devices requested to be shared, but only "
                    f"{len(devices)} available; sharing those",
                )
            )
        return devices[: rule.devices]
    chosen: list[Device] = []
    missing: list[str] = []
    for ref in rule.devices:
        found = next((d for d in devices if ref in (d.uuid, d.index)), None)
        if found is None:
            missing.append(ref)
        elif found not in chosen:
            chosen.append(found)
    if missing:
        refs = ", ".join(repr(m) for m in missing)
        outcome = "sharing the others" if chosen else "entry not applied"
        misfits.append(
            Misfit(
                "SharingDevicesMissing",
                entry,
                f"{entry}: {rule.name}: no device with index or UUID {refs} on this node; {outcome}",
            )
        )
    return chosen


def _apply_sharing(
    resources: dict[str, Resource], sharing: Sequence[ReplicatedResource], misfits: list[Misfit]
) -> list[Resource]:
    out: dict[str, list[Device]] = {n: list(r.devices.values()) for n, r in resources.items()}
    meta: dict[str, ReplicatedResource] = {}
    counts: dict[str, dict[str, int]] = {}
    claimed: dict[str, tuple[int, str]] = {}  # device id -> (entry index, entry path)
    for i, rule in enumerate(sharing):
        entry = _entry(rule, i)
        source = resources.get(rule.name)
        if source is None:
            misfits.append(
                Misfit(
                    "SharingEntryUnmatched",
                    entry,
                    f"{entry}: {rule.name} matches no resource on this node; entry not applied "
                    f"(it could match: {', '.join(sorted(resources)) or 'none, the node has no devices'})",
                )
            )
            continue
        shared = _select_shared(source, rule, entry, misfits)
        if not shared:
            continue
        overlap: dict[str, list[Device]] = {}
        for device in shared:
            if device.id in claimed:
                overlap.setdefault(claimed[device.id][1], []).append(device)
        for other, both in overlap.items():
            misfits.append(
                Misfit(
                    "SharingEntriesOverlap",
                    entry,
                    f"{entry}: selects {device_names(both)} of {rule.name}, also selected by {other}; "
                    "entries with the same name need disjoint devices; entry not applied",
                )
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
    result: list[Resource] = []
    for name, devices in out.items():
        if not devices:
            continue
        rule_for = meta.get(name)
        if rule_for is None:
            result.append(Resource(name, DeviceSet(sorted(devices, key=lambda d: d.order))))
        else:
            per_unit = counts[name]
            result.append(
                Resource(
                    name,
                    DeviceSet(sorted(devices, key=lambda d: d.order)),
                    sharing=rule_for.strategy,
                    replicas=min(per_unit.values()),
                    fail_requests_greater_than_one=rule_for.fail_requests_greater_than_one,
                    replica_counts=per_unit,
                )
            )
    result.sort(key=lambda r: r.name)
    return result
