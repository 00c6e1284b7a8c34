"""NVIDIA's opaque device configuration for `gpu.nvidia.com` (pure): `resource.nvidia.com/v1beta1`
`GpuConfig` (whole GPUs) and `MigDeviceConfig` (MIG devices), from a claim's
`status.allocation.devices.config`.

    sharing:
      strategy: TimeSlicing                  # or MPS
      timeSlicingConfig: {interval: Short}   # Default (when left out), Short, Medium, Long; GpuConfig only
      mpsConfig:                             # MPS
        defaultActiveThreadPercentage: 50              # 0..100
        defaultPinnedDeviceMemoryLimit: 10Gi           # at least 1Mi, every device
        defaultPerDevicePinnedMemoryLimit: {"0": 4Gi}  # by the device's index in its group, or UUID

- Checked as NVIDIA's strict decoder and validation check them; anything else is one line for the
  claim (unknown apiVersion, kind or field, a wrong type, an unknown strategy or interval, a config
  of the other strategy, a percentage outside 0..100, a limit under 1Mi, a key naming no device).
- Precedence (NVIDIA's): the DeviceClass's configs (`source: FromClass`), then the claim's, the
  later winning.
- A result takes the last config naming its request (or the request of its subrequest), which must
  be of its device's kind; else the last config naming no request and of its kind; else none.
- Configs of other drivers are not ours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvdp.base.units import MIB, parse_quantity
from nvdp.plugins.dra.claims import Allocated, ClaimError, ClaimRef
from nvdp.plugins.dra.names import DRIVER_NAME

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
NOT_SUPPORTED = ("VfioDeviceConfig", "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig")
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # nvidia-smi's --set-timeslice levels
SOURCES = ("FromClass", "FromClaim")  # lowest precedence first
_FIELDS = {
    "": ("apiVersion", "kind", "sharing"),
    "sharing": ("strategy", "timeSlicingConfig", "mpsConfig"),
    "sharing.timeSlicingConfig": ("interval",),
    "sharing.mpsConfig": (
        "defaultActiveThreadPercentage",
        "defaultPinnedDeviceMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
    ),
}


class ConfigProblem(ValueError):
    """What is wrong with one config (the text after `<kind>: `)."""


@dataclass(frozen=True)
class MpsSettings:
    thread_percentage: int | None = None
    pinned_default: int | None = None  # bytes, every device of the group
    pinned_per_device: tuple[tuple[str, int], ...] = ()  # (index or UUID as written, bytes)

    def pinned_memory(self, uuids: Sequence[str]) -> dict[str, int]:
        """UUID -> bytes for the group's devices (`uuids`, the order an index counts in). Raises
        ConfigProblem for a key that names none of them."""
        limits = dict.fromkeys(uuids, self.pinned_default) if self.pinned_default is not None else {}
        for key, size in self.pinned_per_device:
            if key in uuids:
                limits[key] = size
            elif key.isdecimal() and int(key) < len(uuids):
                limits[uuids[int(key)]] = size
            else:
                raise ConfigProblem(
                    f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: key {key!r} names no device "
                    f"of the {len(uuids)} it applies to (an index from 0, or a UUID)"
                )
        return limits


@dataclass(frozen=True)
class DeviceSharing:
    """One config: its kind and how it shares (strategy None: no sharing set)."""

    kind: str
    strategy: str | None = None
    interval: str | None = None  # TimeSlicing on a GpuConfig
    mps: MpsSettings | None = None  # MPS


@dataclass(frozen=True)
class OpaqueConfig:
    requests: tuple[str, ...]  # none: every request
    sharing: DeviceSharing


def opaque_configs(claim: Mapping[str, Any], ref: ClaimRef) -> list[OpaqueConfig]:
    """This driver's configs of an allocated claim, lowest precedence first. Raises ClaimError."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    entries = devices.get("config") if isinstance(devices, Mapping) else None
    found: list[tuple[int, OpaqueConfig]] = []
    for entry in entries if isinstance(entries, list) else []:
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER_NAME:
            continue
        source = entry.get("source", "FromClaim")
        if source not in SOURCES:
            raise ClaimError(
                f"ResourceClaim {ref}: a config's source {source!r} is not FromClass or FromClaim"
            )
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"ResourceClaim {ref}: a config's requests are not a list of names")
        found.append(
            (SOURCES.index(source), OpaqueConfig(tuple(requests), parse(opaque.get("parameters"), ref)))
        )
    return [config for _, config in sorted(found, key=lambda f: f[0])]  # stable: in order per source


def parse(parameters: object, ref: ClaimRef) -> DeviceSharing:
    """One config's parameters, checked strictly. Raises ClaimError."""
    if not isinstance(parameters, Mapping):
        raise ClaimError(f"ResourceClaim {ref}: a {DRIVER_NAME} config's parameters are not an object")
    kind, version = parameters.get("kind"), parameters.get("apiVersion")
    if version != API_VERSION:
        raise ClaimError(
            f"ResourceClaim {ref}: a {DRIVER_NAME} config's apiVersion {version!r} is not {API_VERSION}"
        )
    if kind in NOT_SUPPORTED:
        raise ClaimError(f"ResourceClaim {ref}: {kind} is not supported by nvdp")
    if kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ClaimError(
            f"ResourceClaim {ref}: a {DRIVER_NAME} config's kind {kind!r} is not {GPU_CONFIG} or {MIG_CONFIG}"
        )
    try:
        return _sharing(str(kind), parameters)
    except ConfigProblem as problem:
        raise ClaimError(f"ResourceClaim {ref}: {kind}: {problem}") from None


def resolve(
    configs: Sequence[OpaqueConfig],
    allocated: Sequence[Allocated],
    is_mig: Callable[[str], bool],
    ref: ClaimRef,
) -> list[tuple[DeviceSharing, list[Allocated]]]:
    """Each config that applies with the results it applies to (configs without sharing left out).
    `is_mig(device)`: whether a result's device is a MIG device. Raises ClaimError."""
    groups: dict[int, list[Allocated]] = {}
    for result in allocated:
        kind = MIG_CONFIG if is_mig(result.device) else GPU_CONFIG
        named = {result.request, result.request.split("/")[0]}
        for at in range(len(configs) - 1, -1, -1):
            config = configs[at]
            if named & set(config.requests):
                if config.sharing.kind != kind:
                    what = "MIG device" if kind == MIG_CONFIG else "GPU"
                    raise ClaimError(
                        f"ResourceClaim {ref}: a {config.sharing.kind} cannot apply to {what} "
                        f"{result.device} (request {result.request})"
                    )
                groups.setdefault(at, []).append(result)
                break
            if not config.requests and config.sharing.kind == kind:
                groups.setdefault(at, []).append(result)
                break
    return [
        (configs[at].sharing, results)
        for at, results in sorted(groups.items())
        if configs[at].sharing.strategy
    ]


# ---- the strict reading ------------------------------------------------------------------------------


def _sharing(kind: str, parameters: Mapping[str, Any]) -> DeviceSharing:
    _known(parameters, "")
    sharing = _object(parameters.get("sharing"), "sharing")
    if sharing is None:
        return DeviceSharing(kind)
    _known(sharing, "sharing", leave_out=("timeSlicingConfig",) if kind == MIG_CONFIG else ())
    strategy = sharing.get("strategy")
    if strategy not in (TIME_SLICING, MPS):
        raise ConfigProblem(f"unknown sharing strategy {strategy!r} ({TIME_SLICING} or {MPS})")
    slicing = _object(sharing.get("timeSlicingConfig"), "sharing.timeSlicingConfig")
    mps = _object(sharing.get("mpsConfig"), "sharing.mpsConfig")
    if strategy == TIME_SLICING:
        if mps is not None:
            raise ConfigProblem(f"sharing.mpsConfig is set, but the strategy is {TIME_SLICING}")
        interval = None
        if kind == GPU_CONFIG:
            _known(slicing or {}, "sharing.timeSlicingConfig")
            interval = (slicing or {}).get("interval", "Default")
            if interval is None:
                interval = "Default"
            if interval not in INTERVALS:
                raise ConfigProblem(f"unknown time-slice interval {interval!r} ({', '.join(INTERVALS)})")
        return DeviceSharing(kind, TIME_SLICING, interval=interval)
    if slicing is not None:
        raise ConfigProblem(f"sharing.timeSlicingConfig is set, but the strategy is {MPS}")
    return DeviceSharing(kind, MPS, mps=_mps(mps or {}))


def _mps(mps: Mapping[str, Any]) -> MpsSettings:
    _known(mps, "sharing.mpsConfig")
    at = "sharing.mpsConfig."
    percentage = mps.get("defaultActiveThreadPercentage")
    if percentage is not None:
        if not isinstance(percentage, int) or isinstance(percentage, bool):
            raise ConfigProblem(f"{at}defaultActiveThreadPercentage {percentage!r} is not an integer")
        if not 0 <= percentage <= 100:
            raise ConfigProblem(f"{at}defaultActiveThreadPercentage {percentage} is not within 0 to 100")
    default = mps.get("defaultPinnedDeviceMemoryLimit")
    pinned = None if default is None else _limit(default, f"{at}defaultPinnedDeviceMemoryLimit")
    per_device = _object(
        mps.get("defaultPerDevicePinnedMemoryLimit"), f"{at}defaultPerDevicePinnedMemoryLimit"
    )
    each = tuple(
        (str(key), _limit(value, f"{at}defaultPerDevicePinnedMemoryLimit[{key}]"))
        for key, value in (per_device or {}).items()
    )
    return MpsSettings(percentage, pinned, each)


def _limit(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigProblem(f"{where} {value!r} is not a quantity")
    try:
        size = parse_quantity(str(value))
    except ValueError:
        raise ConfigProblem(f"{where} {value!r} is not a quantity") from None
    if size < MIB:
        raise ConfigProblem(f"{where} {value!r} is less than 1Mi")
    return size


def _object(value: object, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigProblem(f"{where} is not an object")
    return value


def _known(obj: Mapping[str, Any], where: str, leave_out: tuple[str, ...] = ()) -> None:
    for key in obj:
        if key not in _FIELDS[where] or key in leave_out:
            raise ConfigProblem(f"unknown field {(where + '.' if where else '') + str(key)!r}")
