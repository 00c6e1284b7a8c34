"""The v1 config file: NVIDIA's examples as they are, every validation message, durations, JSON dump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.base.units import format_go_duration
from nvdp.config import (
    Config,
    Health,
    NamePattern,
    PluginOptions,
    ReplicatedResource,
    RuntimeOptions,
    load_file,
    parse,
    parse_go_duration,
    parse_text,
)

DATA = Path(__file__).parent / "data" / "config"
UUID = "b1028956-cfa2-0990-bf4a-5da9abb51763"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_text(text, strict=True)
    return caught.value.problems


# ---- NVIDIA-format files load as they are -------------------------------------------------------


def test_plain_example() -> None:
    config = load_file(DATA / "plain.yaml")
    assert config.flags.mig_strategy == "none"
    assert config.flags.fail_on_init_error is True
    assert config.flags.nvidia_driver_root == "/"
    assert config.flags.plugin.device_list_strategy == ("envvar",)
    assert config.flags.plugin.device_id_strategy == "uuid"
    assert config.flags.plugin.pass_device_specs is False
    assert config.sharing.strategy == "none" and config.sharing.replicated is None


def test_json_form() -> None:
    config = load_file(DATA / "plain.json")  # tab-indented, as some tools write JSON
    assert config.flags.mig_strategy == "single"
    assert config.flags.fail_on_init_error is False
    assert config.flags.nvidia_driver_root == "/run/nvidia/driver"
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-annotations")
    assert config.flags.plugin.device_id_strategy == "index"
    assert config.flags.plugin.pass_device_specs is True


def test_time_slicing_example() -> None:
    sharing = load_file(DATA / "time-slicing.yaml").sharing
    assert sharing.strategy == "time-slicing"
    assert sharing.time_slicing is not None and sharing.replicated is sharing.time_slicing
    assert sharing.time_slicing.fail_requests_greater_than_one is False
    assert sharing.time_slicing.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=10),)
    assert sharing.time_slicing.resources[0].advertised_name == "nvidia.com/gpu"


def test_rename_by_default_names_resources_shared() -> None:
    ts = load_file(DATA / "time-slicing-rename.yaml").sharing.time_slicing
    assert ts is not None and ts.rename_by_default and ts.fail_requests_greater_than_one is True
    assert ts.resources[0].rename == "nvidia.com/gpu.shared"
    assert ts.resources[0].advertised_name == "nvidia.com/gpu.shared"


def test_mps_example_fails_requests_greater_than_one_by_default() -> None:
    config = load_file(DATA / "mps.yaml")
    assert config.sharing.strategy == "mps"
    assert config.sharing.mps is not None and config.sharing.mps.fail_requests_greater_than_one is True
    assert config.flags.mps_root == "/run/nvidia/mps"
    relaxed = parse_text(
        "sharing: {mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, replicas: 2}]}}"
    )
    assert relaxed.sharing.mps is not None and relaxed.sharing.mps.fail_requests_greater_than_one is False


def test_mig_mixed_example() -> None:
    config = load_file(DATA / "mig-mixed.yaml")
    assert config.flags.mig_strategy == "mixed"
    ts = config.sharing.time_slicing
    assert ts is not None
    assert [(r.name, r.replicas) for r in ts.resources] == [
        ("nvidia.com/gpu", 2),
        ("nvidia.com/mig-1g.5gb", 2),
        ("nvidia.com/mig-2g.10gb", 2),
        ("nvidia.com/mig-3g.20gb", 3),
        ("nvidia.com/mig-7g.40gb", 7),
    ]


def test_resource_names_get_the_default_prefix() -> None:
    config = load_file(DATA / "resources.yaml")
    assert config.resources.gpus == (
        NamePattern("*A100*", "nvidia.com/a100"),
        NamePattern("*", "nvidia.com/gpu"),
    )
    assert config.resources.mig == (
        NamePattern("1g.5gb", "nvidia.com/mig-small"),
        NamePattern("*", "nvidia.com/mig-large"),
    )
    ts = config.sharing.time_slicing
    assert ts is not None
    assert ts.resources[0] == ReplicatedResource(
        name="nvidia.com/a100",
        replicas=4,
        rename="nvidia.com/a100-shared",
        devices=(
            "0",
            "1",
            "2:0",
            f"GPU-{UUID}",
            f"MIG-GPU-{UUID}/3/0",
            "MIG-c6d4f1e2-1d5f-5f4a-9c7a-5a2b1e0f3c4d",
        ),
    )
    assert ts.resources[1].devices == 2 and ts.resources[1].rename is None


def test_same_name_with_disjoint_devices_and_one_replica() -> None:
    config = parse_text(
        _ts(
            "{name: gpu, replicas: 2, devices: [0, 1, 2, 3]}, "
            "{name: gpu, replicas: 4, devices: [4, 5, 6, 7]}, "
            "{name: gpu, replicas: 1, devices: [GPU-8a1b2c3d-0000-4000-8000-000000000000]}"
        )
    )
    ts = config.sharing.time_slicing
    assert ts is not None
    assert [(r.name, r.replicas, r.devices) for r in ts.resources] == [
        ("nvidia.com/gpu", 2, ("0", "1", "2", "3")),
        ("nvidia.com/gpu", 4, ("4", "5", "6", "7")),
        ("nvidia.com/gpu", 1, ("GPU-8a1b2c3d-0000-4000-8000-000000000000",)),
    ]


def test_every_nvidia_key() -> None:
    config = load_file(DATA / "full.yaml")
    flags = config.flags
    assert (flags.mig_strategy, flags.fail_on_init_error) == ("single", False)
    assert flags.mps_root == "/run/nvidia/mps"
    assert (flags.nvidia_driver_root, flags.nvidia_dev_root) == ("/run/nvidia/driver", "/")
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (True, True, True)
    assert (flags.use_node_feature_api, flags.device_discovery_strategy) == (True, "nvml")
    plugin = flags.plugin
    assert plugin.pass_device_specs and plugin.device_list_strategy == ("volume-mounts", "cdi-cri")
    assert (plugin.device_id_strategy, plugin.nvidia_ctk_path) == ("index", "/usr/local/bin/nvidia-ctk")
    assert plugin.cdi_feature_flags == ("disable-multiple-csv-devices",)
    assert plugin.shared_devices_allocation_policy == "packed"
    assert flags.gfd is not None and flags.gfd.sleep_interval == 60.0 and flags.gfd.no_timestamp is True
    assert (config.imex.channel_ids, config.imex.required) == ((0,), True)


def test_health_extension() -> None:
    config = load_file(DATA / "health.yaml")
    assert config.health == Health(
        ignored_xids=(94,),
        fatal_xids=(79, 48, 74),
        recovery_quiet_period=150.0,
        probe_interval=10.0,
        single_bit_ecc=True,
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "---\n",
        "{}",
        "version: v1",
        "version: ''",
        "version:",
        "flags:",
        "flags: {plugin: null}",
    ],
    ids=[
        "empty",
        "comment",
        "document-marker",
        "empty-mapping",
        "version-only",
        "empty-version",
        "null-version",
        "null-flags",
        "null-plugin",
    ],
)
def test_empty_and_missing_mean_defaults(text: str) -> None:
    """As NVIDIA: an empty file or a missing version is v1; null means unset."""
    assert parse_text(text) == Config()


def test_empty_file_loads(tmp_path: Path) -> None:
    assert load_file(DATA / "empty.yaml") == Config()


def test_defaults() -> None:
    config = Config()
    assert (config.flags.mig_strategy, config.flags.fail_on_init_error) == ("none", True)
    assert (config.flags.nvidia_driver_root, config.flags.nvidia_dev_root) == ("/", None)
    assert config.flags.mps_root is None
    assert config.flags.device_discovery_strategy == "auto"
    plugin = config.flags.plugin
    assert (plugin.pass_device_specs, plugin.device_list_strategy, plugin.device_id_strategy) == (
        False,
        ("envvar",),
        "uuid",
    )
    assert (plugin.cdi_annotation_prefix, plugin.nvidia_ctk_path, plugin.container_driver_root) == (
        "cdi.k8s.io/",
        "/usr/bin/nvidia-ctk",
        "/driver-root",
    )
    assert plugin.kubelet_socket == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert plugin.shared_devices_allocation_policy == "distributed"
    assert config.health == Health((), None, 300.0, 5.0, False)
    runtime = RuntimeOptions()
    assert (runtime.nvml, runtime.log_format, runtime.log_level, runtime.metrics_address) == (
        "real",
        "text",
        "info",
        ":2112",
    )


# ---- every validation message ------------------------------------------------------------------

_ACCEPTED_TOP = "(accepted: version, flags, resources, sharing, imex, health, dra)"
_NOT_A_DEVICE = 'is not a GPU index, a MIG index ("<gpu>:<mig>") or a GPU or MIG UUID'
_ACCEPTED_PLUGIN = (
    "(accepted: passDeviceSpecs, deviceListStrategy, deviceIDStrategy, cdiAnnotationPrefix, "
    "nvidiaCTKPath, containerDriverRoot, kubeletSocket, cdiFeatureFlags, sharedDevicesAllocationPolicy)"
)
_BAD_NAME = (
    "after the nvidia.com/ prefix it must be a lowercase DNS subdomain "
    "(a-z, 0-9, '-', '.'; alphanumeric at both ends)"
)


def _ts(entry: str) -> str:
    return f"sharing: {{timeSlicing: {{resources: [{entry}]}}}}"


# Each case: id -> (file text, the one problem expected).
MESSAGES = {
    "dra-devices-type": (
        "dra: {devices: some}",
        'dra.devices: must be "all", "none" or a list of GPUs, got "some"',
    ),
    "dra-devices-mig": (
        "dra: {devices: [0, '1:0']}",
        'dra.devices[1]: "1:0" is not a GPU index or a GPU UUID (DRA takes whole GPUs)',
    ),
    "dra-devices-twice": ("dra: {devices: [1, '1']}", "dra.devices: names GPU 1 more than once"),
    "dra-unknown": (
        "dra: {uuids: all}",
        "dra.uuids: unknown field (accepted: devices, consumableCapacity, dynamicMig)",
    ),
    "version": ("version: v2", 'version: unsupported version "v2" (accepted: v1)'),
    "version-type": ("version: 1", "version: must be a string, got 1"),
    "unknown-top": ("version: v1\nfoo: 1", f"foo: unknown field {_ACCEPTED_TOP}"),
    "no-known-top": (
        "foo: 1\nbar: 2",
        "not an nvdp/NVIDIA device plugin config: no known top-level key (found: foo, bar;"
        " known: version, flags, resources, sharing, imex, health, dra)",
    ),
    "unknown-hint": (
        "flags: {migStrategey: none}",
        "flags.migStrategey: unknown field (did you mean migStrategy?)",
    ),
    "unknown-plugin": (
        "flags: {plugin: {unknownKey: 1}}",
        f"flags.plugin.unknownKey: unknown field {_ACCEPTED_PLUGIN}",
    ),
    "mig-strategy": (
        "flags: {migStrategy: foo}",
        'flags.migStrategy: invalid value "foo" (accepted: none, single, mixed)',
    ),
    "bool-type": (
        "flags: {failOnInitError: 'yes'}",
        'flags.failOnInitError: must be true or false, got "yes"',
    ),
    "string-type": (
        "flags: {nvidiaDriverRoot: 2020-01-01}",
        "flags.nvidiaDriverRoot: must be a string, got a value of type date",
    ),
    "discovery": (
        "flags: {deviceDiscoveryStrategy: cdi}",
        'flags.deviceDiscoveryStrategy: invalid value "cdi" (accepted: auto, nvml, tegra, vfio)',
    ),
    "section-type": ("flags: [1]", "flags: must be a mapping, got a list"),
    "id-strategy": (
        "flags: {plugin: {deviceIDStrategy: name}}",
        'flags.plugin.deviceIDStrategy: invalid value "name" (accepted: uuid, index)',
    ),
    "list-strategy": (
        "flags: {plugin: {deviceListStrategy: [envvar, bogus]}}",
        'flags.plugin.deviceListStrategy[1]: invalid value "bogus" '
        "(accepted: envvar, volume-mounts, cdi-annotations, cdi-cri)",
    ),
    "list-strategy-empty": (
        "flags: {plugin: {deviceListStrategy: []}}",
        "flags.plugin.deviceListStrategy: must list at least 1 value",
    ),
    "gfd-duration": (
        "flags: {gfd: {sleepInterval: soon}}",
        'flags.gfd.sleepInterval: invalid duration "soon"',
    ),
    "resources-type": (
        "resources: {gpus: {pattern: '*', name: gpu}}",
        "resources.gpus: must be a list, got a mapping",
    ),
    "resource-name-missing": (
        "resources: {gpus: [{pattern: '*'}]}",
        "resources.gpus[0].name: required field is missing",
    ),
    "resource-pattern-missing": (
        "resources: {mig: [{name: x}]}",
        "resources.mig[0].pattern: required field is missing",
    ),
    "name-format": (
        "resources: {gpus: [{pattern: '*', name: Bad_Name}]}",
        f'resources.gpus[0].name: invalid resource name "Bad_Name": {_BAD_NAME}',
    ),
    "foreign-prefix": (
        "resources: {gpus: [{pattern: '*', name: example.com/gpu}]}",
        f'resources.gpus[0].name: invalid resource name "example.com/gpu": {_BAD_NAME}',
    ),
    "name-length": (
        "resources: {gpus: [{pattern: '*', name: " + "a" * 53 + "}]}",
        f'resources.gpus[0].name: resource name "nvidia.com/{"a" * 53}" is longer than 63 characters',
    ),
    "replicas-type": (
        _ts("{name: gpu, replicas: x}"),
        'sharing.timeSlicing.resources[0].replicas: must be an integer >= 1, got "x"',
    ),
    "replicas-zero": (
        _ts("{name: gpu, replicas: 0}"),
        "sharing.timeSlicing.resources[0].replicas: must be an integer >= 1, got 0",
    ),
    "replicas-float": (
        _ts("{name: gpu, replicas: 2.0}"),
        "sharing.timeSlicing.resources[0].replicas: must be an integer >= 1, got 2.0",
    ),
    "replicas-missing": (
        _ts("{name: gpu}"),
        "sharing.timeSlicing.resources[0].replicas: required field is missing",
    ),
    "devices-string": (
        _ts("{name: gpu, replicas: 2, devices: some}"),
        'sharing.timeSlicing.resources[0].devices: must be "all", a number of devices or a '
        'list of devices, got "some"',
    ),
    "devices-count": (
        _ts("{name: gpu, replicas: 2, devices: 0}"),
        "sharing.timeSlicing.resources[0].devices: must be an integer >= 1, got 0",
    ),
    "devices-entry": (
        _ts("{name: gpu, replicas: 2, devices: [0, GPU-zzz]}"),
        f'sharing.timeSlicing.resources[0].devices[1]: "GPU-zzz" {_NOT_A_DEVICE}',
    ),
    "rename": (
        _ts("{name: gpu, replicas: 2, rename: Shared}"),
        f'sharing.timeSlicing.resources[0].rename: invalid resource name "Shared": {_BAD_NAME}',
    ),
    "no-resources": (
        "sharing: {timeSlicing: {}}",
        "sharing.timeSlicing.resources: must list at least one resource",
    ),
    "same-name-all": (
        _ts("{name: gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3, devices: [4]}"),
        "sharing.timeSlicing.resources[1].devices: overlaps resources[0] of the same name nvidia.com/gpu "
        'on every device ("all"); entries with the same name need disjoint devices',
    ),
    "same-name-counts": (
        _ts("{name: gpu, replicas: 2, devices: 2}, {name: gpu, replicas: 3, devices: 4}"),
        "sharing.timeSlicing.resources[1].devices: overlaps resources[0] of the same name nvidia.com/gpu "
        "on the first 2 devices (both are counts); entries with the same name need disjoint devices",
    ),
    "same-name-lists": (
        _ts("{name: gpu, replicas: 2, devices: [0, 1, 2]}, {name: gpu, replicas: 4, devices: [2, 3, 1]}"),
        "sharing.timeSlicing.resources[1].devices: overlaps resources[0] of the same name nvidia.com/gpu "
        "on devices 2, 1; entries with the same name need disjoint devices",
    ),
    "allocation-policy": (
        "flags: {plugin: {sharedDevicesAllocationPolicy: spread}}",
        'flags.plugin.sharedDevicesAllocationPolicy: invalid value "spread" (accepted: distributed, packed)',
    ),
    "both-strategies": (
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}, "
        "mps: {resources: [{name: gpu, replicas: 2}]}}",
        "sharing: timeSlicing and mps are mutually exclusive; configure only one",
    ),
    "mps-bool": (
        "sharing: {mps: {renameByDefault: 1, resources: [{name: gpu, replicas: 2}]}}",
        "sharing.mps.renameByDefault: must be true or false, got 1",
    ),
    "imex": ("imex: {channelIDs: [1]}", "imex.channelIDs: must be [] or [0], got [1]"),
    "xid-range": (
        "health: {ignoredXids: [-1]}",
        "health.ignoredXids[0]: must be an integer from 0 to 4294967295, got -1",
    ),
    "xids-type": ("health: {fatalXids: 79}", "health.fatalXids: must be a list, got 79"),
    "xid-both": (
        "health: {ignoredXids: [48], fatalXids: [48, 79]}",
        "health: XID 48 is in both ignoredXids and fatalXids",
    ),
    "duration": ("health: {recoveryQuietPeriod: 5x}", 'health.recoveryQuietPeriod: invalid duration "5x"'),
    "duration-negative": (
        "health: {recoveryQuietPeriod: -5m}",
        'health.recoveryQuietPeriod: must be >= 0, got "-5m"',
    ),
    "probe-zero": ("health: {probeInterval: 0}", "health.probeInterval: must be > 0, got 0"),
    "taint-effect": (
        "health: {taintOnFatal: NoEvict}",
        'health.taintOnFatal: invalid value "NoEvict" (accepted: NoSchedule, PreferNoSchedule, NoExecute)',
    ),
    "duration-type": (
        "health: {probeInterval: true}",
        'health.probeInterval: must be a duration such as "30s" or "5m", or a number of seconds, got true',
    ),
    "duration-range": (
        "health: {probeInterval: 1000000000h}",
        'health.probeInterval: out of range, got "1000000000h"',
    ),
    "top-list": ("- a", "the config must be a mapping (version, flags, resources, ...), got a list"),
    "top-scalar": ("hello", "the config must be a mapping (version, flags, resources, ...), got a string"),
    "yaml-syntax": (
        "flags: {a: [}",
        "invalid YAML at line 1, column 13: expected the node content, but found '}'",
    ),
    "yaml-duplicate": ("flags: {}\nflags: {}", 'invalid YAML at line 1, column 1: duplicate key "flags"'),
    "json-duplicate": ('{"version": "v1", "version": "v1"}', 'invalid config: duplicate key "version"'),
    "huge-int": ("a: " + "9" * 50, "invalid YAML at line 1, column 4: number too large"),
    "deep": ("[" * 50000, "invalid config: YAML nested deeper than 100 levels at line 1, column 101"),
    "odd-key": ('version: v1\n"a b": 1', f'"a b": unknown field {_ACCEPTED_TOP}'),
}


@pytest.mark.parametrize("text, expected", list(MESSAGES.values()), ids=list(MESSAGES))
def test_validation_message(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_every_problem_is_reported_at_once() -> None:
    found = problems("""
flags:
  migStrategy: foo
  plugin: {unknownKey: 1, passDeviceSpecs: 1}
sharing:
  timeSlicing:
    resources:
    - {name: gpu, replicas: x}
    - {replicas: 2, devices: [0, true]}
health: {probeInterval: 0}
""")
    assert found == [
        'flags.migStrategy: invalid value "foo" (accepted: none, single, mixed)',
        f"flags.plugin.unknownKey: unknown field {_ACCEPTED_PLUGIN}",
        "flags.plugin.passDeviceSpecs: must be true or false, got 1",
        'sharing.timeSlicing.resources[0].replicas: must be an integer >= 1, got "x"',
        "sharing.timeSlicing.resources[1].name: required field is missing",
        f"sharing.timeSlicing.resources[1].devices[1]: true {_NOT_A_DEVICE}",
        "health.probeInterval: must be > 0, got 0",
    ]


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {migStrategy: foo}\n")
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    assert caught.value.source == str(path)
    assert str(caught.value) == (
        f'{path}: flags.migStrategy: invalid value "foo" (accepted: none, single, mixed)'
    )


@pytest.mark.parametrize(
    "content, expected",
    [
        pytest.param(None, "cannot read config file: No such file or directory", id="missing"),
        pytest.param(b"\xff\xfe", "config file is not UTF-8 text (byte 0)", id="binary"),
    ],
)
def test_unreadable_file(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    assert caught.value.problems == [expected]


@pytest.mark.parametrize(
    "ref",
    [
        "0",
        "12",
        "0:1",
        f"GPU-{UUID}",
        f"GPU-{UUID.replace('-', '')}",
        f"MIG-{UUID}",
        f"MIG-GPU-{UUID}/3/0",
    ],
    ids=["index", "index-2", "mig-index", "gpu-uuid", "gpu-uuid-hex", "mig-uuid", "mig-gpu"],
)
def test_device_refs_accepted(ref: str) -> None:
    ts = parse_text(_ts(f"{{name: gpu, replicas: 2, devices: ['{ref}']}}")).sharing.time_slicing
    assert ts is not None and ts.resources[0].devices == (ref,)


@pytest.mark.parametrize(
    "ref",
    [
        "-1",
        "0:",
        "a:1",
        "0:1:2",
        "GPU-",
        "GPU-1234",
        f"gpu-{UUID}",
        f"MIG-GPU-{UUID}/3",
        f"MIG-GPU-{UUID}/x/0",
        "MIG-",
    ],
    ids=[
        "negative",
        "mig-half",
        "mig-alpha",
        "mig-three",
        "gpu-empty",
        "gpu-short",
        "gpu-lowercase",
        "mig-gpu-short",
        "mig-gpu-alpha",
        "mig-empty",
    ],
)
def test_device_refs_refused(ref: str) -> None:
    assert problems(_ts(f"{{name: gpu, replicas: 2, devices: ['{ref}']}}")) == [
        f'sharing.timeSlicing.resources[0].devices[0]: "{ref}" {_NOT_A_DEVICE}'
    ]


# ---- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0", 0.0),
        ("5m", 300.0),
        ("5m0s", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("2μs", 2e-6),
        ("10ns", 1e-8),
        ("+5s", 5.0),
        ("-5s", -5.0),
    ],
    ids=lambda x: str(x),
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5x", "m", ".s", "5 m", "1h-5m", "-", "5S"], ids=repr)
def test_parse_go_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.0, "0s"),
        (300.0, "5m0s"),
        (3600.0, "1h0m0s"),
        (5400.5, "1h30m0.5s"),
        (90.0, "1m30s"),
        (1.5, "1.5s"),
        (0.3, "300ms"),
        (1.5e-6, "1.5µs"),
        (1e-8, "10ns"),
        (-5.0, "-5s"),
    ],
    ids=lambda x: str(x),
)
def test_format_go_duration(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text


@pytest.mark.parametrize(
    "value, seconds", [("5m", 300.0), (300, 300.0), (2.5, 2.5), ("0", 0.0), (0, 0.0)], ids=lambda x: repr(x)
)
def test_health_durations(value: object, seconds: float) -> None:
    assert parse({"health": {"recoveryQuietPeriod": value}}).health.recovery_quiet_period == seconds


def test_gfd_sleep_interval_number_is_nanoseconds_as_in_go() -> None:
    gfd = parse({"flags": {"gfd": {"sleepInterval": 60_000_000_000}}}).flags.gfd
    assert gfd is not None and gfd.sleep_interval == 60.0


# ---- the JSON dump -----------------------------------------------------------------------------


def test_to_json_is_one_line_with_file_keys_and_runtime() -> None:
    line = PluginOptions(load_file(DATA / "health.yaml")).to_json()
    assert "\n" not in line
    data = json.loads(line)
    assert data["version"] == "v1"
    assert data["flags"]["plugin"]["deviceListStrategy"] == ["envvar"]
    assert data["health"] == {
        "ignoredXids": [94],
        "fatalXids": [79, 48, 74],
        "recoveryQuietPeriod": "2m30s",
        "probeInterval": "10s",
        "singleBitEcc": True,
    }
    assert {k: data[k] for k in ("configFile", "nvml", "logFormat", "logLevel", "metricsAddress")} == {
        "configFile": None,
        "nvml": "real",
        "logFormat": "text",
        "logLevel": "info",
        "metricsAddress": ":2112",
    }
    assert "nvidiaDevRoot" not in data["flags"]  # unset values are left out


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir()))
def test_to_dict_round_trips(name: str) -> None:
    config = load_file(DATA / name)
    assert parse(config.to_dict()) == config
    assert parse_text(json.dumps(config.to_dict())) == config
