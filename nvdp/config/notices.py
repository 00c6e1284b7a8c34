"""Migration notices: one line per key of an accepted config that the two plugins read differently.

- A notice names each key nvdp applies and NVIDIA's plugin (v0.20.0) does not, and each key written
  in another letter case than the schema's (both apply it; the notice gives the schema's spelling).
- The lines go to the plugin's start-up log and `nvdp config check`.
- NVIDIA's plugin drops `resources.gpus` / `resources.mig`; in `sharing.timeSlicing` / `sharing.mps`
  it drops `rename` (`<name>.shared` under `renameByDefault`) and resets `devices` to all devices,
  each with a "not yet supported ... Ignoring..." warning; `replicas: 1` fails the whole file.
- nvdp applies each of them (README: "Drop-in: differences from NVIDIA's plugin").
"""

from __future__ import annotations

from nvdp.config.model import SHARED_SUFFIX, Config, Devices, ReplicatedResources

NVIDIA_IGNORES = "NVIDIA's plugin ignores this; nvdp applies it"
ANY_CASE = "NVIDIA's plugin matches keys in any letter case"
MAX_NOTICES = 20  # lines for one config; a generated file may repeat a key thousands of times


def migration_notices(config: Config) -> list[str]:
    """One line per key of `config` written in another letter case, then per key that NVIDIA's plugin
    ignores (or refuses) and nvdp applies."""
    lines = [f"{written}: applied as {schema} ({ANY_CASE})" for written, schema in config.recased_keys]
    lines += [
        f"resources.gpus[{n}]: {NVIDIA_IGNORES}: GPUs whose product name matches {p.pattern!r} are "
        f"advertised as {p.name} (NVIDIA's: nvidia.com/gpu)"
        for n, p in enumerate(config.resources.gpus)
    ]
    lines += [
        f"resources.mig[{n}]: {NVIDIA_IGNORES}: MIG devices whose profile matches {p.pattern!r} are "
        f"advertised as {p.name} (NVIDIA's: nvidia.com/mig-<profile>, or nvidia.com/gpu with the single "
        "MIG strategy)"
        for n, p in enumerate(config.resources.mig)
    ]
    for key, section in (("timeSlicing", config.sharing.time_slicing), ("mps", config.sharing.mps)):
        if section is not None:
            lines += _sharing_notices(f"sharing.{key}", section)
    if len(lines) > MAX_NOTICES:
        lines[MAX_NOTICES:] = [f"and {len(lines) - MAX_NOTICES} more notices"]
    return lines


def _sharing_notices(path: str, section: ReplicatedResources) -> list[str]:
    lines = []
    for n, entry in enumerate(section.resources):
        where = f"{path}.resources[{n}]"
        nvidia_name = entry.name + SHARED_SUFFIX if section.rename_by_default else entry.name
        if entry.rename is not None and entry.rename != nvidia_name:
            lines.append(
                f"{where}.rename: {NVIDIA_IGNORES}: the replicas are advertised as {entry.rename} "
                f"(NVIDIA's: {nvidia_name})"
            )
        if entry.devices != "all":
            lines.append(
                f"{where}.devices: {NVIDIA_IGNORES}: {entry.name} is shared on {_selection(entry.devices)} "
                "only, the other devices stay whole (NVIDIA's: every device shared)"
            )
        if entry.replicas == 1:
            lines.append(
                f"{where}.replicas: NVIDIA's plugin refuses 1 (its replicas must be >= 2); nvdp applies it: "
                "the selected devices are advertised whole, not shared"
            )
    return lines


def _selection(devices: Devices) -> str:
    if isinstance(devices, int):
        return f"the first {devices} device{'s' if devices > 1 else ''}"
    return f"device{'s' if len(devices) > 1 else ''} {', '.join(str(d) for d in devices)}"
