"""GPU feature labels (pure): NVIDIA's gpu-feature-discovery label set, from the very `Resource` list
the plugin advertises (`nvdp.node.gpus.resources.build_resources`), so the two cannot disagree.

- `<resource>.count`: distinct GPUs / MIG devices; `.replicas`: the sharing replicas, else 1 (with
  per-GPU counts, the largest); `.sharing-strategy`: `time-slicing`, `mps` or `none`.
- `nvidia.com/gpu.*` is always written: every GPU MIG-enabled under `mixed` gives the model with
  count 0 and replicas 0, as NVIDIA does.
- Where NVIDIA's gfd differs from the resources, nvdp writes NVIDIA's values: renamed GPUs are
  still labelled `nvidia.com/gpu` (product without `-SHARED` under `renameByDefault`) beside the
  renamed labels; under `none` with the model all MIG-enabled, `gpu.replicas=0`, strategy `none`.
- A node of several GPU models gets its majority model (a warning names them all); under `single`,
  a layout NVIDIA calls invalid (`single_strategy_problem`) gets `invalid_mig_labels`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from nvdp.base.units import MIB
from nvdp.node.gpus.misfits import Misfit
from nvdp.node.gpus.resources import DEFAULT_PREFIX, Resource
from nvdp.node.nvml.types import GpuInfo, MigDeviceInfo

Labels = dict[str, str]

GPU_RESOURCE = DEFAULT_PREFIX + "gpu"
TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
MACHINE_UNKNOWN = "unknown"

_FAMILIES = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
_MIG_PROFILE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.\d+gb(?P<attr>[+-][a-z0-9.]+)?$")


@dataclass(frozen=True)
class NodeFacts:
    """What the labels need beyond the resources: NVML's answers and the machine's identity."""

    gpus: tuple[GpuInfo, ...]
    driver_version: str  # "550.54.15"
    cuda_driver_version: str  # "12.4"
    machine: str = MACHINE_UNKNOWN  # DMI product name, as read
    modes: Mapping[str, str] | None = None  # gpu uuid -> "compute" | "graphics" | "unknown"
    vgpu_present: bool = False


@dataclass(frozen=True)
class GpuRenames:
    """The names sharing entries for `nvidia.com/gpu` advertise its GPUs as (their `rename`s), and
    whether their section renames by default."""

    targets: frozenset[str] = frozenset()
    by_default: bool = False


@dataclass(frozen=True)
class LabelResult:
    """A pass's labels; `warnings` about the labels themselves, `misfits` what of the config does not
    fit this node (the plugin's, `nvdp.node.gpus.resources.NodeResources.misfits`)."""

    labels: Labels
    warnings: tuple[str, ...] = ()
    misfits: tuple[Misfit, ...] = ()


def sanitise(text: str) -> str:
    """A label value from free text: drop characters labels cannot hold, runs of spaces to `-`."""
    return "-".join(_UNSAFE.sub("", text).split())


def gpu_family(major: int, minor: int) -> str:
    """The architecture family of a CUDA compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major in (10, 12):
        return "blackwell"
    return _FAMILIES.get(major, "undefined")


def majority_model(gpus: Sequence[GpuInfo]) -> str:
    """The most common GPU model; a tie goes to the model of the lowest GPU index."""
    counts = Counter(g.name for g in gpus)
    best = max(counts.values())
    return next(g.name for g in sorted(gpus, key=lambda g: g.index) if counts[g.name] == best)


def version_labels(driver_version: str, cuda_version: str) -> Labels:
    """`cuda.driver-version.*`, `cuda.runtime-version.*` and the older `cuda.driver.*` / `cuda.runtime.*`.

    Raises ValueError when the driver version is not X.Y[.Z] or the CUDA version not X.Y.
    """
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f'driver version "{driver_version}" does not match the format X.Y[.Z]')
    major, minor = parts[0], parts[1]
    revision = parts[2] if len(parts) == 3 else ""
    cuda = cuda_version.split(".")
    if len(cuda) < 2 or not all(p.isdigit() for p in cuda):
        raise ValueError(f'CUDA driver version "{cuda_version}" does not match the format X.Y')
    cuda_major, cuda_minor = str(int(cuda[0])), str(int(cuda[1]))
    p = "nvidia.com/cuda."
    return {
        p + "driver-version.major": major,
        p + "driver-version.minor": minor,
        p + "driver-version.revision": revision,
        p + "driver-version.full": driver_version,
        p + "driver.major": major,
        p + "driver.minor": minor,
        p + "driver.rev": revision,
        p + "runtime-version.major": cuda_major,
        p + "runtime-version.minor": cuda_minor,
        p + "runtime-version.full": f"{cuda_major}.{cuda_minor}",
        p + "runtime.major": cuda_major,
        p + "runtime.minor": cuda_minor,
    }


def mig_attributes(mig: MigDeviceInfo, parent: GpuInfo) -> dict[str, int]:
    """NVML's MIG device attributes (memory MiB, multiprocessors, slices, engines) of a MIG device.

    The facade has no nvmlDeviceGetAttributes yet, so they come from the profile name and the
    parent's architecture, as the driver sizes them on A100/A30 (Ampere) and H100/H200 (Hopper).
    """
    m = _MIG_PROFILE.match(mig.profile)
    gi = int(m["g"]) if m else 1
    ci = int(m["c"]) if m and m["c"] else gi
    media = bool(m and m["attr"] == "+me")
    major = parent.compute_capability[0]
    per_slice = {8: 14, 9: 16, 10: 18}.get(major, 14)
    multiprocessors = ci * per_slice
    if major == 9 and ci == 7:
        multiprocessors = 132  # a full H100 GPU instance gets every SM
    if major >= 9:  # Hopper and later: a decoder and a JPEG engine per slice
        decoders = jpeg = gi
        ofa = 1 if gi == 7 else 0
    else:
        decoders = {1: 0, 2: 1, 3: 2, 4: 2, 7: 5}.get(gi, gi // 2)
        jpeg = ofa = 1 if gi == 7 else 0
    if media:
        decoders, jpeg, ofa = max(decoders, 1), max(jpeg, 1), max(ofa, 1)
    return {
        "memory": mig.memory_bytes // MIB,
        "multiprocessors": multiprocessors,
        "slices.gi": gi,
        "slices.ci": ci,
        "engines.copy": gi,
        "engines.decoder": decoders,
        "engines.encoder": 0,
        "engines.jpeg": jpeg,
        "engines.ofa": ofa,
    }


def node_labels(
    facts: NodeFacts,
    resources: Sequence[Resource],
    *,
    mig_strategy: str,
    sharing_strategy: str,
    renamed: Collection[str] = (),
    gpu_renames: GpuRenames = GpuRenames(),
) -> LabelResult:
    """Every label but the timestamp. `sharing_strategy` is the config's (`none`, `time-slicing`,
    `mps`); `renamed` the resource names that sharing rules rename to (no `-SHARED` product suffix);
    `gpu_renames` those of `nvidia.com/gpu`. Raises ValueError for an unparseable driver / CUDA version."""
    warnings: list[str] = []
    if not facts.gpus:
        return LabelResult({}, ("no GPUs found on the node; no labels generated",))
    by_uuid = {g.uuid: g for g in facts.gpus}
    labels: Labels = {"nvidia.com/gpu.machine": sanitise_machine(facts.machine)}
    labels.update(version_labels(facts.driver_version, facts.cuda_driver_version))
    labels["nvidia.com/mig.capable"] = _bool(any(g.mig_capable for g in facts.gpus))
    if mig_strategy != "none":
        labels["nvidia.com/mig.strategy"] = mig_strategy
    labels["nvidia.com/mps.capable"] = _bool(sharing_strategy == "mps")
    labels["nvidia.com/vgpu.present"] = _bool(facts.vgpu_present)
    models = Counter(g.name for g in facts.gpus)
    if len(models) > 1:
        majority = majority_model(facts.gpus)
        warnings.append(
            f"multiple GPU models on the node ({', '.join(sorted(models))}); "
            f"the nvidia.com/gpu.* labels describe the majority model {majority}"
        )

    model = majority_model(facts.gpus)
    if not any(r.name == GPU_RESOURCE for r in resources):
        # No allocatable nvidia.com/gpu: still say which GPUs the node has.
        gpu = next(g for g in facts.gpus if g.name == model)
        labels.update(_gpu_identity(GPU_RESOURCE, gpu, facts))
        labels.update(_counts(GPU_RESOURCE, 0, 0, "none", _product(gpu.name)))
        labels.update(_renamed_gpu_labels(resources, gpu_renames, gpu.name))
    for resource in resources:
        labels.update(_resource_labels(resource, by_uuid, facts, resource.name in renamed))
    if mig_strategy == "none" and all(g.mig_enabled for g in facts.gpus if g.name == model):
        # NVIDIA's gfd labels MIG-enabled GPUs without their sharing, and MIG-disabled GPUs of the
        # model (here: none) over them.
        labels.update(_counts(GPU_RESOURCE, int(labels[f"{GPU_RESOURCE}.count"]), 0, "none", _product(model)))
    return LabelResult(labels, tuple(warnings))


def _renamed_gpu_labels(resources: Sequence[Resource], renames: GpuRenames, model: str) -> Labels:
    """NVIDIA's `nvidia.com/gpu` count, replicas, sharing strategy and product for whole GPUs shared
    under new names only (its gfd ignores the rename); nothing when there are none."""
    shared = [
        r for r in resources if r.name in renames.targets and not any(d.mig for d in r.devices.values())
    ]
    if not shared:
        return {}
    units = {d.uuid for r in shared for d in r.devices.values()}
    replicas = max(max(r.replica_counts.values(), default=r.replicas) for r in shared)
    strategy = next((r.sharing for r in shared if r.sharing), None) if replicas > 1 else None
    product = _product(model, shared=replicas > 1 and not renames.by_default)
    return _counts(GPU_RESOURCE, len(units), replicas, strategy or "none", product)


def single_strategy_problem(gpus: Sequence[GpuInfo], sharing_strategy: str) -> str | None:
    """Why NVIDIA's gfd labels a node invalid under the single MIG strategy (its words), or None.

    NVIDIA's checks, in its order: a MIG-enabled GPU without MIG devices, MIG-enabled beside
    MIG-disabled GPUs, more than one MIG profile; and MPS with MIG enabled, where NVIDIA's gfd fails
    the pass (nvdp labels the node invalid instead: the plugin shares no MIG device with MPS)."""
    migs = [g for g in gpus if g.mig_enabled]
    if not migs:
        return None  # the single strategy on a node without MIG is the none strategy
    if any(not g.mig_devices for g in migs):
        return "at least one MIG device is enabled but empty"
    if len(migs) != len(gpus):
        return "devices with MIG enabled and disable detected"
    if len({m.profile for g in migs for m in g.mig_devices}) > 1:
        return "more than one MIG device type present on node"
    if sharing_strategy == "mps":
        return "MPS sharing is not supported for MIG devices"
    return None


def invalid_mig_labels(facts: NodeFacts, reason: str, *, whole_gpu_sharing: str = "none") -> LabelResult:
    """NVIDIA's labels for a node the single MIG strategy cannot serve (`single_strategy_problem`).

    As NVIDIA's gfd: its whole-GPU labels first (the GPUs' identity: `gpu.family`, `gpu.compute.*`,
    `gpu.mode`, and `gpu.sharing-strategy`, which is `whole_gpu_sharing`: the config's strategy when it
    time-slices `nvidia.com/gpu` and the node has MIG-disabled GPUs of the labelled model, else
    `none`), then `gpu.product=<model>-MIG-INVALID` (the first MIG-enabled GPU's model) and count,
    replicas and memory 0. `mps.capable` is false: nothing is shared with MPS on such a node."""
    base = node_labels(facts, (), mig_strategy="single", sharing_strategy="none")
    labels = dict(base.labels)
    gpu = next((g for g in facts.gpus if g.mig_enabled), facts.gpus[0])
    labels.update(
        {
            "nvidia.com/gpu.product": _product(gpu.name, "MIG", "INVALID"),
            "nvidia.com/gpu.count": "0",
            "nvidia.com/gpu.replicas": "0",
            "nvidia.com/gpu.memory": "0",
            "nvidia.com/gpu.sharing-strategy": whole_gpu_sharing,
        }
    )
    return LabelResult(labels, (*base.warnings, f"invalid configuration for mig-strategy=single: {reason}"))


def sanitise_machine(machine: str) -> str:
    """The DMI product name as a valid label value: NVIDIA turns spaces into `-`; nvdp also drops
    characters a label value cannot hold and keeps 63 of them, so NFD does not reject the label."""
    value = sanitise(machine)[:63].strip("-_.")
    return value or MACHINE_UNKNOWN


def format_labels(labels: Mapping[str, str]) -> str:
    """The NFD local feature file: `key=value` lines, sorted."""
    return "".join(f"{k}={labels[k]}\n" for k in sorted(labels))


# ---- helpers ----------------------------------------------------------------------------------


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _product(*parts: str, shared: bool = False) -> str:
    words = [sanitise(p) for p in parts if p]
    if shared:
        words.append("SHARED")
    return "-".join(w for w in words if w)


def _counts(prefix: str, count: int, replicas: int, strategy: str, product: str) -> Labels:
    return {
        f"{prefix}.count": str(count),
        f"{prefix}.replicas": str(replicas),
        f"{prefix}.sharing-strategy": strategy,
        f"{prefix}.product": product,
    }


def _gpu_identity(prefix: str, gpu: GpuInfo, facts: NodeFacts) -> Labels:
    major, minor = gpu.compute_capability
    out: Labels = {}
    if gpu.memory_mib:
        out[f"{prefix}.memory"] = str(gpu.memory_mib)
    if major:
        out[f"{prefix}.family"] = gpu_family(major, minor)
        out[f"{prefix}.compute.major"] = str(major)
        out[f"{prefix}.compute.minor"] = str(minor)
    if prefix == GPU_RESOURCE:
        out["nvidia.com/gpu.mode"] = (facts.modes or {}).get(gpu.uuid, "compute")
    return out


def _resource_labels(
    resource: Resource, by_uuid: Mapping[str, GpuInfo], facts: NodeFacts, renamed: bool
) -> Labels:
    devices = list(resource.devices.values())
    units = list(dict.fromkeys(d.uuid for d in devices))
    shared = resource.sharing is not None
    # Per-GPU counts: the largest, the most devices the kubelet sees for one GPU (NVIDIA has no such
    # case; a replica is then never less than 1/replicas of a GPU, as the MPS daemon's default).
    replicas = max(resource.replica_counts.values(), default=resource.replicas) if shared else 1
    strategy = resource.sharing if resource.sharing else "none"
    # NVIDIA's -SHARED suffix marks a shared resource that kept its name.
    suffix = shared and not renamed and replicas > 1
    migs = [d.mig for d in devices if d.mig is not None]
    if migs:
        profiles = Counter(m.profile for m in migs)
        profile = min(profiles, key=lambda p: (-profiles[p], p))
        mig = next(m for m in migs if m.profile == profile)
        parent = by_uuid[mig.parent_uuid]
        out = _counts(
            resource.name,
            len(units),
            replicas,
            strategy,
            _product(parent.name, "MIG", profile, shared=suffix),
        )
        if resource.name == GPU_RESOURCE:  # single strategy: the parent's architecture too, as NVIDIA
            identity = _gpu_identity(GPU_RESOURCE, parent, facts)
            out.update({k: v for k, v in identity.items() if k != f"{GPU_RESOURCE}.memory"})
        out.update({f"{resource.name}.{k}": str(v) for k, v in mig_attributes(mig, parent).items()})
        return out
    gpus = [by_uuid[u] for u in units if u in by_uuid]
    model = majority_model(gpus)
    gpu = next(g for g in gpus if g.name == model)
    out = _counts(resource.name, len(units), replicas, strategy, _product(model, shared=suffix))
    out.update(_gpu_identity(resource.name, gpu, facts))
    return out
