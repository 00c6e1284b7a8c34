"""MIG geometry of a simulated GPU: profile names, placements, instance ids and memory (pure).

- A GPU has `compute_slices` (7 on A100/H100, 4 on A30) and 8 memory slices (4 with 4 compute).
- `Gg.Mgb` takes G compute slices and the memory slices holding M GB, at a start aligned to its
  memory size; GI ids follow the driver's tree over memory slices (A100: 7g.40gb GI 0, 3g.20gb 1-2,
  2g.10gb 3-6, 1g.5gb 7-13).
- `Cc.Gg.Mgb` is a C-slice compute instance in a `Gg.Mgb` GPU instance; consecutive ones share it
  (compute instance ids 0, 1, ...).
- Each MIG device carries its `MigPlacement` (the driver's profile id as `nvidia-smi mig -lgip`
  lists them, its memory slices) and its multiprocessors and engines (`sim_engines`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvdp.node.nvml.types import MigEngines, MigPlacement

_PROFILE = re.compile(
    r"^(?:(?P<c>[1-9]\d*)c\.)?(?P<g>[1-9]\d*)g\.(?P<gb>[1-9]\d*)gb(?P<attr>[+-][a-z][a-z0-9.]*)?$"
)


class MigLayoutError(ValueError):
    """A MIG profile name or layout that this GPU cannot have.

    A ValueError, not an NvdpError, on purpose: an internal signal of the simulator that never reaches
    a user as is (the node-file parser turns it into a `ConfigError` line, the backend into a
    `SimEventError`)."""


@dataclass(frozen=True)
class MigProfile:
    name: str  # as written: "1g.5gb", "1c.2g.10gb", "1g.5gb+me"
    compute_slices: int  # C (= G for a whole GPU instance)
    gpu_slices: int  # G
    memory_gb: int

    @property
    def gpu_instance_profile(self) -> str:
        """The name of the GPU instance this profile lives in ("1c.2g.10gb" -> "2g.10gb")."""
        return self.name.split(".", 1)[1] if self.compute_slices != self.gpu_slices else self.name


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a compute instance in a placed GPU instance."""

    profile: str
    gi_id: int
    ci_id: int
    memory_mib: int
    placement: MigPlacement


# The driver's GPU instance profile ids: (GPU slices, memory slices, suffix) -> id, on GPUs with 8
# memory slices (A100, H100, H200) and with 4 (A30).
_PROFILE_IDS = {
    8: {(1, 1, ""): 19, (1, 1, "+me"): 20, (1, 2, ""): 15, (2, 2, ""): 14, (3, 4, ""): 9, (4, 4, ""): 5,
        (7, 8, ""): 0},
    4: {(1, 1, ""): 14, (1, 1, "+me"): 21, (2, 2, ""): 5, (2, 2, "+me"): 6, (4, 4, ""): 0},
}  # fmt: skip
_SUFFIX = re.compile(r"[+-].*$")


def profile_id(profile: MigProfile, slices: int, geometry: MigGeometry) -> int:
    """The driver's id of a GPU instance profile (a suffix the table lacks: the plain profile's; a
    profile it lacks altogether: 100 + 10 x GPU slices + memory slices, an id no driver uses)."""
    suffix = m.group(0) if (m := _SUFFIX.search(profile.name)) else ""
    table = _PROFILE_IDS[geometry.memory_slices]
    key = (profile.gpu_slices, slices)
    return table.get((*key, suffix), table.get((*key, ""), 100 + 10 * profile.gpu_slices + slices))


def sim_engines(profile_name: str, compute_capability_major: int) -> MigEngines:
    """A MIG device's multiprocessors and engines as the driver sizes them: per compute slice 14
    multiprocessors on Ampere, 16 on Hopper (a whole H100 gets all 132); a copy engine per GPU slice;
    decoders, JPEG and OFA engines as Ampere and Hopper share them out (`+me`: at least one each)."""
    profile = parse_profile(profile_name)
    gi, ci, major = profile.gpu_slices, profile.compute_slices, compute_capability_major
    multiprocessors = 132 if major == 9 and ci == 7 else ci * {8: 14, 9: 16, 10: 18}.get(major, 14)
    if major >= 9:
        decoders = jpeg = gi
        ofa = 1 if gi == 7 else 0
    else:
        decoders = {1: 0, 2: 1, 3: 2, 4: 2, 7: 5}.get(gi, gi // 2)
        jpeg = ofa = 1 if gi == 7 else 0
    if "+me" in profile_name:
        decoders, jpeg, ofa = max(decoders, 1), max(jpeg, 1), max(ofa, 1)
    return MigEngines(multiprocessors, gi, decoders, 0, jpeg, ofa)


def parse_profile(name: str) -> MigProfile:
    """Parse a MIG profile name the way NVIDIA's tools spell them ("[Cc.]Gg.Mgb[+attr|-attr]")."""
    m = _PROFILE.match(name)
    if m is None:
        raise MigLayoutError(f"{name!r} is not a MIG profile name like 1g.5gb, 1c.2g.10gb or 1g.5gb+me")
    g = int(m["g"])
    c = int(m["c"]) if m["c"] else g
    if c > g:
        raise MigLayoutError(f"{name}: a compute instance cannot be larger than its GPU instance")
    return MigProfile(name, c, g, int(m["gb"]))


@dataclass(frozen=True)
class MigGeometry:
    """The MIG geometry of one GPU model."""

    total_memory_mib: int
    compute_slices: int = 7
    memory_mib_by_slices: Mapping[int, int] | None = None  # the driver's figures where known

    @property
    def memory_slices(self) -> int:
        return 8 if self.compute_slices > 4 else 4

    @property
    def total_gb(self) -> int:
        return math.ceil(self.total_memory_mib / 1024)

    def slices_for(self, profile: MigProfile) -> int:
        """Memory slices a profile takes; MigLayoutError when this GPU has no such profile."""
        exact = profile.memory_gb * self.memory_slices / self.total_gb
        slices = max(1, math.floor(exact + 0.5))
        expected_gb = math.floor(slices * self.total_gb / self.memory_slices + 0.5)
        if (
            slices & (slices - 1)
            or slices > self.memory_slices
            or expected_gb != profile.memory_gb
            or profile.gpu_slices > self.compute_slices
            or profile.gpu_slices > slices
        ):
            raise MigLayoutError(
                f"{profile.name}: no such MIG profile on a {self.total_gb} GB GPU with "
                f"{self.compute_slices} compute slices (one memory slice holds "
                f"{self.total_gb / self.memory_slices:g} GB)"
            )
        return slices

    def memory_mib(self, slices: int) -> int:
        if self.memory_mib_by_slices and slices in self.memory_mib_by_slices:
            return self.memory_mib_by_slices[slices]
        # The driver keeps ~2.5% of each instance for itself, in 128 MiB steps.
        return int(self.total_memory_mib * slices / self.memory_slices * 0.975) // 128 * 128

    def gi_id(self, slices: int, start: int) -> int:
        return self.memory_slices // slices - 1 + start // slices


@dataclass
class _GpuInstance:
    profile: MigProfile
    slices: int
    compute_instances: list[MigProfile]
    start: int = -1


def place(layout: Sequence[str], geometry: MigGeometry) -> tuple[MigInstance, ...]:
    """Place the MIG devices of `layout` on a GPU; returns them in NVML's order (by GI, then CI id)."""
    instances: list[_GpuInstance] = []
    for name in layout:
        profile = parse_profile(name)
        slices = geometry.slices_for(profile)
        last = instances[-1] if instances else None
        if (
            profile.compute_slices < profile.gpu_slices
            and last is not None
            and last.profile.gpu_instance_profile == profile.gpu_instance_profile
            and last.compute_instances[0].compute_slices < last.profile.gpu_slices
            and sum(ci.compute_slices for ci in last.compute_instances) + profile.compute_slices
            <= profile.gpu_slices
        ):
            last.compute_instances.append(profile)
            continue
        instances.append(_GpuInstance(profile, slices, [profile]))

    if not _fit(sorted(instances, key=lambda gi: -gi.slices), 0, geometry):
        raise MigLayoutError(
            f"{', '.join(layout)}: these MIG devices do not fit one GPU "
            f"({geometry.compute_slices} compute slices, {geometry.memory_slices} memory slices)"
        )
    placed: list[MigInstance] = []
    for gi in instances:
        gi_id = geometry.gi_id(gi.slices, gi.start)
        memory = geometry.memory_mib(gi.slices)
        where = MigPlacement(profile_id(gi.profile, gi.slices, geometry), gi.start, gi.slices)
        placed.extend(
            MigInstance(ci.name, gi_id, n, memory, where) for n, ci in enumerate(gi.compute_instances)
        )
    return tuple(sorted(placed, key=lambda d: (d.gi_id, d.ci_id)))


def _fit(todo: list[_GpuInstance], used: int, geometry: MigGeometry) -> bool:
    """Backtracking placement: first free aligned start for each instance, largest first."""
    if not todo:
        return True
    gi, rest = todo[0], todo[1:]
    for start in range(0, geometry.memory_slices - gi.slices + 1, gi.slices):
        mask = ((1 << gi.slices) - 1) << start
        if used & mask or start + gi.profile.gpu_slices > geometry.compute_slices:
            continue
        gi.start = start
        if _fit(rest, used | mask, geometry):
            return True
    return False


def gpu_instance_profiles(geometry: MigGeometry) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """The GPU instance profiles a GPU of this geometry has, as the driver lists them (`nvidia-smi mig
    -lgip`): (name, profile id, memory slices, possible placement starts). A placement starts at a
    multiple of its size and leaves room for its compute slices (an A100's 1g.5gb: 0-6, 2g.10gb:
    0, 2, 4, 3g.20gb: 0, 4), as nvmlDeviceGetGpuInstancePossiblePlacements_v2 answers."""
    found = []
    for (gpu_slices, slices, suffix), profile_id in _PROFILE_IDS[geometry.memory_slices].items():
        if gpu_slices > geometry.compute_slices:
            continue
        gb = math.floor(slices * geometry.total_gb / geometry.memory_slices + 0.5)
        name = f"{gpu_slices}g.{gb}gb{suffix}"
        starts = tuple(
            start
            for start in range(0, geometry.memory_slices - slices + 1, slices)
            if start + gpu_slices <= geometry.compute_slices
        )
        found.append((name, profile_id, slices, starts))
    return tuple(sorted(found, key=lambda p: (p[2], int(p[0].split("g", 1)[0]), p[0])))
