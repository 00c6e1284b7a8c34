"""What a config makes of this node's GPUs: the one resource builder of `nvdp plugin`, `nvdp gfd`,
`nvdp mps-control-daemon` and `nvdp config check`, so the plugin, labels and MPS daemons agree.

- `ResourceRules` are the config's parts that name and share devices; `build` applies them
  (`nvdp.node.gpus.resources.build_resources`), then MPS's limits on this node's GPUs.
- An MPS resource MPS cannot serve here (MIG devices, more clients than a GPU before compute
  capability 7.5 takes) is withheld with a misfit saying why; what MPS refuses of the config alone
  is `nvdp.config.rules`.
- `dra_gpus`: the GPUs the config gives the DRA driver (the device plugin serves the rest);
  `dra_sharing`: which of those it shares by capacity and which it partitions by MIG on demand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvdp.config.model import DRA_ALL, DRA_NONE, MPS, Config, Dra, DraDevices, NamePattern, ReplicatedResource
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import NodeResources, Resource, build_resources
from nvdp.node.nvml.types import GpuInfo

MAX_MPS_CLIENTS_BEFORE_7_5 = 16  # MPS clients per GPU below compute capability 7.5 (Turing)


@dataclass(frozen=True)
class ResourceRules:
    """How a config names and shares devices: its MIG strategy, `resources` patterns, the active
    sharing section's entries and the shared-devices allocation policy."""

    mig_strategy: str = "none"
    gpu_patterns: tuple[NamePattern, ...] = ()
    mig_patterns: tuple[NamePattern, ...] = ()
    sharing: tuple[ReplicatedResource, ...] = ()
    allocation_policy: str = "distributed"
    dra_devices: DraDevices = DRA_NONE  # the GPUs the DRA driver serves, not these rules

    @classmethod
    def of(cls, config: Config) -> ResourceRules:
        return cls(
            mig_strategy=config.flags.mig_strategy,
            gpu_patterns=config.resources.gpus,
            mig_patterns=config.resources.mig,
            sharing=config.sharing.entries,
            allocation_policy=config.flags.plugin.shared_devices_allocation_policy,
            dra_devices=config.dra.devices,
        )

    def build(self, gpus: Sequence[GpuInfo], mig_minors: Mapping[str, int] | None = None) -> NodeResources:
        """The resources these rules make of `gpus`, and the misfits: what of the config does not fit
        this node. Raises ConfigError only for an unknown MIG strategy (the config's form)."""
        built = build_resources(
            gpus,
            mig_strategy=self.mig_strategy,
            gpu_patterns=self.gpu_patterns,
            mig_patterns=self.mig_patterns,
            sharing=self.sharing,
            mig_minors=mig_minors,
            allocation_policy=self.allocation_policy,
        )
        unfit = mps_misfits(built.resources, gpus)
        withheld = {name for misfit in unfit for name in misfit.withholds}
        return NodeResources([r for r in built.resources if r.name not in withheld], (*built.misfits, *unfit))


def mps_misfits(resources: Sequence[Resource], gpus: Sequence[GpuInfo]) -> list[Misfit]:
    """What MPS cannot share on this node's devices: one misfit per MPS resource, withholding it."""
    by_uuid: Mapping[str, GpuInfo] = {g.uuid: g for g in gpus}
    misfits = []
    for resource in resources:
        if resource.sharing != MPS:
            continue
        mig = next((d for d in resource.devices.values() if d.mig is not None), None)
        problems = []
        if mig is not None:
            problems.append(f"MPS is not supported on MIG devices (MIG device {mig.index} would be shared)")
        else:
            for gpu_uuid in dict.fromkeys(d.gpu_uuid for d in resource.devices.values()):
                gpu = by_uuid.get(gpu_uuid)
                if gpu is None or gpu.compute_capability >= (7, 5):
                    continue
                replicas = resource.replicas_of(gpu_uuid)
                if replicas > MAX_MPS_CLIENTS_BEFORE_7_5:
                    major, minor = gpu.compute_capability
                    problems.append(
                        f"{replicas} replicas are more than MPS supports on GPU {gpu.index} "
                        f"(compute capability {major}.{minor}: {MAX_MPS_CLIENTS_BEFORE_7_5} clients)"
                    )
        if problems:
            misfits.append(
                Misfit(
                    "MpsUnsupported",
                    resource.name,
                    f"sharing.mps: {resource.name}: {'; '.join(problems)}; not advertised",
                    withholds=(resource.name,),
                )
            )
    return misfits


def dra_gpus(devices: DraDevices, gpus: Sequence[GpuInfo]) -> tuple[frozenset[str], tuple[Misfit, ...]]:
    """The uuids of the GPUs `dra.devices` gives the DRA driver (with their MIG devices; the device
    plugin serves the others: one GPU, one API, `nvdp.plugins.handoff`), and a misfit for each GPU it names
    that this node lacks."""
    if devices == DRA_NONE:
        return frozenset(), ()
    if devices == DRA_ALL:
        return frozenset(g.uuid for g in gpus), ()
    owned: set[str] = set()
    misfits = []
    for ref in devices:
        gpu = next((g for g in gpus if ref in (g.uuid, str(g.index))), None)
        if gpu is None:
            misfits.append(
                Misfit("DraDevicesMissing", f"GPU {ref}", f"dra.devices: no GPU {ref} on this node; left out")
            )
        else:
            owned.add(gpu.uuid)
    return frozenset(owned), tuple(misfits)


@dataclass(frozen=True)
class DraSharing:
    """How the DRA driver serves each of its GPUs beyond whole: by memory share (`capacity`) or by
    MIG devices made per claim (`dynamic_mig`); uuids, disjoint."""

    capacity: frozenset[str] = frozenset()
    dynamic_mig: frozenset[str] = frozenset()


def dra_sharing(dra: Dra, gpus: Sequence[GpuInfo]) -> tuple[DraSharing, tuple[Misfit, ...]]:
    """`dra.consumableCapacity` and `dra.dynamicMig` on this node. A GPU named must be the DRA
    driver's (`dra.devices`) and, for dynamicMig, in MIG mode (the plugin never toggles it); "all"
    takes every such GPU. A GPU named in both (an index in one, its UUID in the other: the form
    check sees only the words) is served whole. Each GPU left out is one misfit."""
    owned, _ = dra_gpus(dra.devices, gpus)
    capacity, misfits = _named(dra.consumable_capacity, "consumableCapacity", gpus, owned)
    dynamic, more = _named(dra.dynamic_mig, "dynamicMig", gpus, owned)
    misfits += more
    both = capacity & dynamic
    for gpu in (g for g in gpus if g.uuid in both):
        message = f"dra: GPU {gpu.index} is in both consumableCapacity and dynamicMig; served whole"
        misfits.append(Misfit("DraSharingMisfit", f"GPU {gpu.index}", message))
    return DraSharing(capacity - both, dynamic - both), tuple(misfits)


def _named(
    refs: DraDevices, key: str, gpus: Sequence[GpuInfo], owned: frozenset[str]
) -> tuple[frozenset[str], list[Misfit]]:
    if refs == DRA_NONE:
        return frozenset(), []
    misfits = []
    if refs == DRA_ALL:
        named = [g for g in gpus if g.uuid in owned and (key != "dynamicMig" or g.mig_capable)]
    else:
        named = []
        for ref in refs:
            gpu = next((g for g in gpus if ref in (g.uuid, str(g.index))), None)
            if gpu is None:
                misfits.append(
                    Misfit(
                        "DraSharingMisfit", f"GPU {ref}", f"dra.{key}: no GPU {ref} on this node; left out"
                    )
                )
            else:
                named.append(gpu)
    chosen = set()
    for gpu in named:
        why = _why_not(key, gpu, owned)
        if why:
            misfits.append(
                Misfit("DraSharingMisfit", f"GPU {gpu.index}", f"dra.{key}: GPU {gpu.index} left out: {why}")
            )
        else:
            chosen.add(gpu.uuid)
    return frozenset(chosen), misfits


def _why_not(key: str, gpu: GpuInfo, owned: frozenset[str]) -> str:
    if gpu.uuid not in owned:
        return "it is not the DRA driver's (dra.devices)"
    if gpu.fault is not None:
        return f"it failed at enumeration ({gpu.fault})"
    if key == "dynamicMig" and not gpu.mig_capable:
        return "it is not MIG-capable"
    if key == "dynamicMig" and not gpu.mig_enabled:
        return "MIG mode is off (the plugin never changes it)"
    return ""
