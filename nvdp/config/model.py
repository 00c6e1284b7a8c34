"""The v1 configuration as frozen dataclasses (NVIDIA's api/config/v1, plus nvdp's extensions).

Each file field carries its file key and its converter in the dataclass field metadata, so one
table drives both parsing (`nvdp.config.load`) and the JSON dump. Fields that have a default
in NVIDIA's plugin hold that default; `None` means "unset" where nothing is set by default
(`mpsRoot`, `nvidiaDevRoot`, a resource's `rename`, `health.fatalXids`, the gfd section).
The settings that only flags and env vars set (`nvml`, logging, metrics, CDI, ...) are not here:
`nvdp.config.runtime`.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from nvdp.base.units import format_go_duration
from nvdp.config import values as v

VERSION = "v1"
RESOURCE_NAME_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME_LENGTH = 63
MIG_STRATEGIES = ("none", "single", "mixed")
TIME_SLICING: Literal["time-slicing"] = "time-slicing"  # the sharing strategies
MPS: Literal["mps"] = "mps"
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
DEVICE_DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra", "vfio")  # the plugin refuses vfio (rules.py)
SHARED_DEVICES_ALLOCATION_POLICIES = ("distributed", "packed")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")  # Kubernetes' taint effects
# NVIDIA's CDI spec generation feature flags (nvcdi, container toolkit v1.19/v1.20), which its
# plugin passes on from --cdi-feature-flags; what each does in nvdp: docs/cdi.md.
IPC_DISCOVERER_OFF_FLAG = "disable-ipc-discoverer"
EXPLICIT_DRIVER_LIBRARIES_FLAG = "enable-explicit-driver-libraries"
NO_ADDITIONAL_GIDS_FLAG = "no-additional-gids-for-device-nodes"
COHERENT_ANNOTATIONS_FLAG = "enable-coherent-annotations"
CDI_FEATURE_FLAGS = (
    IPC_DISCOVERER_OFF_FLAG,
    "disable-multiple-csv-devices",
    "disable-nvsandbox-utils",
    COHERENT_ANNOTATIONS_FLAG,
    EXPLICIT_DRIVER_LIBRARIES_FLAG,
    NO_ADDITIONAL_GIDS_FLAG,
)
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_NVIDIA_CTK_PATH = "/usr/bin/nvidia-ctk"
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"

Devices = Literal["all"] | int | tuple[str, ...]


def _key(
    key: str,
    convert: v.Converter | None = None,
    *,
    section: type | None = None,
    items: type | None = None,
    dump: v.Converter | None = None,
    **kwargs: Any,
) -> Any:
    """A dataclass field read from `key` in the file (see nvdp.config.load for the walk)."""
    meta = {"key": key, "convert": convert, "section": section, "items": items, "dump": dump}
    return field(metadata=meta, **kwargs)


# ---- checks for values with NVIDIA-specific rules -----------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")


def resource_name(value: object) -> str:
    """NVIDIA's NewResourceName: add `nvidia.com/`, at most 63 characters, a DNS subdomain after it."""
    name = v.string(value)
    full = name if name.startswith(RESOURCE_NAME_PREFIX + "/") else f"{RESOURCE_NAME_PREFIX}/{name}"
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        raise v.InvalidValue(
            f"resource name {v.show(full)} is longer than {MAX_RESOURCE_NAME_LENGTH} characters"
        )
    if not _DNS_SUBDOMAIN.fullmatch(full.split("/", 1)[1]):
        raise v.InvalidValue(
            f"invalid resource name {v.show(name)}: after the {RESOURCE_NAME_PREFIX}/ prefix it must be a "
            "lowercase DNS subdomain (a-z, 0-9, '-', '.'; alphanumeric at both ends)"
        )
    return full


def _is_uuid(text: str) -> bool:
    return bool(_UUID.fullmatch(text))


def is_device_ref(text: str) -> bool:
    """A GPU index, a MIG index "<gpu>:<mig>", a GPU UUID or a MIG UUID (either MIG UUID form)."""
    if re.fullmatch(r"[0-9]+(:[0-9]+)?", text):
        return True
    if text.startswith("GPU-"):
        return _is_uuid(text[4:])
    if text.startswith("MIG-GPU-"):
        parent, _, rest = text[8:].partition("/")
        return _is_uuid(parent) and bool(re.fullmatch(r"[0-9]+/[0-9]+", rest))
    return text.startswith("MIG-") and _is_uuid(text[4:])


def _device_ref(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= v.INT64_MAX:
        return str(value)
    if isinstance(value, str) and is_device_ref(value):
        return value
    raise v.InvalidValue(
        f'{v.show(value)} is not a GPU index, a MIG index ("<gpu>:<mig>") or a GPU or MIG UUID'
    )


_device_list = v.list_of(_device_ref)


def replicated_devices(value: object) -> Devices:
    if value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool):
        return v.integer(1)(value)
    if isinstance(value, list):
        return _device_list(value)
    raise v.InvalidValue(f'must be "all", a number of devices or a list of devices, got {v.show(value)}')


DRA_ALL: Literal["all"] = "all"  # dra.devices, dra.consumableCapacity, dra.dynamicMig
DRA_NONE: Literal["none"] = "none"
DraDevices = Literal["all", "none"] | tuple[str, ...]


def _whole_gpu(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= v.INT64_MAX:
        return str(value)
    if isinstance(value, str) and (value.isdigit() or (value.startswith("GPU-") and _is_uuid(value[4:]))):
        return value
    raise v.InvalidValue(f"{v.show(value)} is not a GPU index or a GPU UUID (DRA takes whole GPUs)")


_whole_gpus = v.list_of(_whole_gpu)


def dra_devices(value: object) -> DraDevices:
    """`dra.devices`, `dra.consumableCapacity`, `dra.dynamicMig`: "all", "none" or a list of GPU
    indices / UUIDs, each named once."""
    if value in (DRA_ALL, DRA_NONE):
        return DRA_ALL if value == DRA_ALL else DRA_NONE
    if not isinstance(value, list):
        raise v.InvalidValue(f'must be "all", "none" or a list of GPUs, got {v.show(value)}')
    refs = _whole_gpus(value)
    twice = sorted({r for r in refs if refs.count(r) > 1})
    if twice:
        raise v.InvalidValue(f"names GPU {twice[0]} more than once")
    return refs


def _version(value: object) -> str:
    text = v.string(value) or VERSION  # NVIDIA reads an empty version as v1
    if text != VERSION:
        raise v.InvalidValue(f"unsupported version {v.show(text)} (accepted: {VERSION})")
    return text


_channel_ids = v.list_of(v.integer(0))


def imex_channel_ids(value: object) -> tuple[int, ...]:
    ids = _channel_ids(value)
    if ids not in ((), (0,)):
        raise v.InvalidValue(f"must be [] or [0], got {list(ids)}")
    return ids


_xids = v.list_of(v.integer(0, 2**32 - 1))
_seconds = v.duration()


def _go(value: object) -> object:
    return format_go_duration(value) if isinstance(value, float) else value


INFINITE = "infinite"  # gfd's sleep interval: label once, then sleep until a signal
_nanoseconds = v.duration(10**9)


def sleep_interval(value: object) -> float:
    """`flags.gfd.sleepInterval`: a Go duration, a plain number of nanoseconds (NVIDIA's Go type), or
    `infinite` (math.inf)."""
    return math.inf if value == INFINITE else _nanoseconds(value)


def _sleep(value: object) -> object:
    return INFINITE if value == math.inf else _go(value)


# ---- the file model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginFlags:
    """`flags.plugin`: options of the device plugin only."""

    pass_device_specs: bool = _key("passDeviceSpecs", v.boolean, default=False)
    device_list_strategy: tuple[str, ...] = _key(
        "deviceListStrategy",
        v.list_of(v.choice(*DEVICE_LIST_STRATEGIES), min_items=1, single=True),
        default=("envvar",),
    )
    device_id_strategy: str = _key("deviceIDStrategy", v.choice(*DEVICE_ID_STRATEGIES), default="uuid")
    cdi_annotation_prefix: str = _key("cdiAnnotationPrefix", v.string, default=DEFAULT_CDI_ANNOTATION_PREFIX)
    nvidia_ctk_path: str = _key("nvidiaCTKPath", v.string, default=DEFAULT_NVIDIA_CTK_PATH)
    container_driver_root: str = _key("containerDriverRoot", v.string, default=DEFAULT_CONTAINER_DRIVER_ROOT)
    kubelet_socket: str = _key("kubeletSocket", v.string, default=DEFAULT_KUBELET_SOCKET)
    cdi_feature_flags: tuple[str, ...] = _key(
        "cdiFeatureFlags", v.list_of(v.choice(*CDI_FEATURE_FLAGS), single=True), default=()
    )
    shared_devices_allocation_policy: str = _key(
        "sharedDevicesAllocationPolicy", v.choice(*SHARED_DEVICES_ALLOCATION_POLICIES), default="distributed"
    )


@dataclass(frozen=True)
class GfdFlags:
    """`flags.gfd`: gpu-feature-discovery options, kept as read (None: GFD's default)."""

    oneshot: bool | None = _key("oneshot", v.boolean, default=None)
    no_timestamp: bool | None = _key("noTimestamp", v.boolean, default=None)
    sleep_interval: float | None = _key("sleepInterval", sleep_interval, dump=_sleep, default=None)
    output_file: str | None = _key("outputFile", v.string, default=None)
    machine_type_file: str | None = _key("machineTypeFile", v.string, default=None)


@dataclass(frozen=True)
class Flags:
    """`flags`: options shared by the plugin and GFD; each one also has a flag and an env var."""

    mig_strategy: str = _key("migStrategy", v.choice(*MIG_STRATEGIES), default="none")
    fail_on_init_error: bool = _key("failOnInitError", v.boolean, default=True)
    mps_root: str | None = _key("mpsRoot", v.string, default=None)
    nvidia_driver_root: str = _key("nvidiaDriverRoot", v.string, default="/")
    nvidia_dev_root: str | None = _key("nvidiaDevRoot", v.string, default=None)  # resolve: driver root
    gdrcopy_enabled: bool = _key("gdrcopyEnabled", v.boolean, default=False)
    gds_enabled: bool = _key("gdsEnabled", v.boolean, default=False)
    mofed_enabled: bool = _key("mofedEnabled", v.boolean, default=False)
    use_node_feature_api: bool | None = _key("useNodeFeatureAPI", v.boolean, default=None)  # GFD only
    device_discovery_strategy: str = _key(
        "deviceDiscoveryStrategy", v.choice(*DEVICE_DISCOVERY_STRATEGIES), default="auto"
    )
    plugin: PluginFlags = _key("plugin", section=PluginFlags, default_factory=PluginFlags)
    gfd: GfdFlags | None = _key("gfd", section=GfdFlags, default=None)

    @property
    def dev_root(self) -> str:
        """Where the device nodes are on the host: nvidiaDevRoot, else the driver root (the one default)."""
        return self.nvidia_dev_root or self.nvidia_driver_root


@dataclass(frozen=True)
class NamePattern:
    """A `resources.gpus` / `resources.mig` entry (NVIDIA's `Resource`): a wildcard pattern over
    product / MIG profile names, and the resource name the devices it matches get."""

    pattern: str = _key("pattern", v.string)
    name: str = _key("name", resource_name)  # fully qualified: nvidia.com/<name>

    def matches(self, value: str) -> bool:
        return fnmatch.fnmatchcase(value, self.pattern)


@dataclass(frozen=True)
class Resources:
    gpus: tuple[NamePattern, ...] = _key("gpus", items=NamePattern, default=())
    mig: tuple[NamePattern, ...] = _key("mig", items=NamePattern, default=())


@dataclass(frozen=True)
class ReplicatedResource:
    """A `sharing.<timeSlicing|mps>.resources` entry.

    `devices` is "all", a count of devices, or GPU indices, MIG indices ("gpu:mig") and UUIDs as
    strings. `rename` is already `<name>.shared` when the section has `renameByDefault`. Several
    entries may have one name when their devices are disjoint (per-GPU replica counts). The entry is
    the one record of a sharing rule (`nvdp.node.gpus.resources` applies it as is): its section's strategy and
    `failRequestsGreaterThanOne` are set on it at load.
    """

    name: str = _key("name", resource_name)
    replicas: int = _key("replicas", v.integer(1))  # 1: not shared (no `::` IDs)
    rename: str | None = _key("rename", resource_name, default=None)
    devices: Devices = _key("devices", replicated_devices, default="all")
    strategy: str = TIME_SLICING  # or MPS: the section it is in
    fail_requests_greater_than_one: bool = False

    @property
    def advertised_name(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True)
class ReplicatedResources:
    """`sharing.timeSlicing` / `sharing.mps`. `fail_requests_greater_than_one` is resolved at load:
    unset means false for time-slicing and true for MPS (NVIDIA's behaviour)."""

    rename_by_default: bool = _key("renameByDefault", v.boolean, default=False)
    fail_requests_greater_than_one: bool | None = _key("failRequestsGreaterThanOne", v.boolean, default=None)
    resources: tuple[ReplicatedResource, ...] = _key("resources", items=ReplicatedResource, default=())


@dataclass(frozen=True)
class Sharing:
    """`sharing`: at most one of time-slicing and MPS (they are mutually exclusive)."""

    time_slicing: ReplicatedResources | None = _key("timeSlicing", section=ReplicatedResources, default=None)
    mps: ReplicatedResources | None = _key("mps", section=ReplicatedResources, default=None)

    @property
    def strategy(self) -> Literal["none", "time-slicing", "mps"]:
        if self.mps is not None and self.mps.resources:
            return MPS
        if self.time_slicing is not None and self.time_slicing.resources:
            return TIME_SLICING
        return "none"

    @property
    def replicated(self) -> ReplicatedResources | None:
        """The active strategy's section."""
        return {MPS: self.mps, TIME_SLICING: self.time_slicing, "none": None}[self.strategy]

    @property
    def entries(self) -> tuple[ReplicatedResource, ...]:
        """The active strategy's entries (none without sharing)."""
        replicated = self.replicated
        return replicated.resources if replicated is not None else ()


@dataclass(frozen=True)
class Imex:
    """`imex`: IMEX channels injected into containers that get GPUs."""

    channel_ids: tuple[int, ...] = _key("channelIDs", imex_channel_ids, default=())
    required: bool = _key("required", v.boolean, default=False)


@dataclass(frozen=True)
class Health:
    """`health` (nvdp's extension). `ignored_xids` add to the default application XIDs; `fatal_xids`
    replace the health module's default fatal set (None: the defaults). Times are seconds;
    `recovery_quiet_period` 0 disables recovery. `taint_on_fatal` is the effect of the Node taint put
    on while no GPU of the node is left healthy and one has a fatal fault (None: no taint)."""

    ignored_xids: tuple[int, ...] = _key("ignoredXids", _xids, default=())
    fatal_xids: tuple[int, ...] | None = _key("fatalXids", _xids, default=None)
    recovery_quiet_period: float = _key("recoveryQuietPeriod", _seconds, dump=_go, default=300.0)
    probe_interval: float = _key("probeInterval", v.duration(positive=True), dump=_go, default=5.0)
    single_bit_ecc: bool = _key("singleBitEcc", v.boolean, default=False)
    # How long the monitor may stay degraded (NVML event wait failing) before /readyz fails; None: 5m.
    degraded_grace_period: float | None = _key("degradedGracePeriod", _seconds, dump=_go, default=None)
    taint_on_fatal: str | None = _key("taintOnFatal", v.choice(*TAINT_EFFECTS), default=None)


@dataclass(frozen=True)
class Dra:
    """`dra` (nvdp's extension): the GPUs the DRA driver (`nvdp dra-kubelet-plugin`) serves on this
    node, with their MIG devices; the device plugin serves the others (one GPU, one API:
    `nvdp.plugins.handoff`). Default none: every GPU is the device plugin's.

    Of the DRA driver's GPUs, `consumable_capacity` are shared by memory share (MPS-enforced) and
    `dynamic_mig` are partitioned into MIG devices made per claim; a GPU is in at most one of them
    (`nvdp.config.rules.dra_problems`); "all" means all of the DRA driver's GPUs."""

    devices: DraDevices = _key("devices", dra_devices, default=DRA_NONE)
    consumable_capacity: DraDevices = _key("consumableCapacity", dra_devices, default=DRA_NONE)
    dynamic_mig: DraDevices = _key("dynamicMig", dra_devices, default=DRA_NONE)


@dataclass(frozen=True)
class Config:
    """The v1 config file: NVIDIA's schema plus nvdp's `health` and `dra` sections (flags and env
    merged in by `nvdp.config.resolve`)."""

    version: str = _key("version", _version, default=VERSION)
    flags: Flags = _key("flags", section=Flags, default_factory=Flags)
    resources: Resources = _key("resources", section=Resources, default_factory=Resources)
    sharing: Sharing = _key("sharing", section=Sharing, default_factory=Sharing)
    imex: Imex = _key("imex", section=Imex, default_factory=Imex)
    health: Health = _key("health", section=Health, default_factory=Health)
    dra: Dra = _key("dra", section=Dra, default_factory=Dra)
    # Keys the file wrote in another letter case, each as (its path as written, as the schema spells
    # it): read all the same, as NVIDIA's plugin does (nvdp.config.load); one notice each. Not part
    # of what the config says, so not compared.
    recased_keys: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """In file form (camelCase keys, Go durations, unset values left out):
        `nvdp.config.parse(config.to_dict())` gives back the same config."""
        dumped = _dump(self)
        assert isinstance(dumped, dict)
        return dumped


def _dump(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        out: dict[str, object] = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if "key" in f.metadata and item is not None:  # fields set at load are not the file's
                dump = f.metadata["dump"]
                out[f.metadata["key"]] = dump(item) if dump else _dump(item)
        return out
    if isinstance(value, tuple):
        return [_dump(item) for item in value]
    return value
