"""MIG strategies, resource naming and sharing replicas (pure)."""

from __future__ import annotations

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import NamePattern, ReplicatedResource
from nvdp.node.gpus.devices import mig_cap_paths, parse_mig_minors
from nvdp.node.gpus.resources import (
    build_resources,
)
from nvdp.node.nvml.types import GpuInfo
from tests.builders import full_gpu, mig_device_info, mig_enabled_gpu


def names(resources: list) -> dict[str, int]:
    return {r.name: len(r.devices) for r in resources}


def test_none_strategy_advertises_every_gpu_whole() -> None:
    gpus = [mig_enabled_gpu(0, *["1g.5gb"] * 7), full_gpu(1)]
    resources = build_resources(gpus, mig_strategy="none").resources
    assert names(resources) == {"nvidia.com/gpu": 2}
    device = resources[0].devices[gpus[0].uuid]
    assert device.index == "0" and device.paths == ("/dev/nvidia0",) and device.numa_node == 0


def test_mixed_strategy_names_mig_profiles() -> None:
    gpus = [mig_enabled_gpu(0, "1g.5gb", "1g.5gb", "2g.10gb"), full_gpu(1)]
    resources = build_resources(gpus, mig_strategy="mixed").resources
    assert names(resources) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1}
    mig = next(r for r in resources if r.name == "nvidia.com/mig-2g.10gb")
    device = next(iter(mig.devices.values()))
    assert device.index == "0:2"
    assert device.gpu_uuid == gpus[0].uuid
    assert device.paths[0] == "/dev/nvidia0" and device.paths[1].startswith("/dev/nvidia-caps/nvidia-cap")
    assert mig.socket_name == "nvidia-mig-2g.10gb.sock"


def test_single_strategy_uniform_profile() -> None:
    gpus = [mig_enabled_gpu(0, *["1g.5gb"] * 2), mig_enabled_gpu(1, *["1g.5gb"] * 2)]
    assert names(build_resources(gpus, mig_strategy="single").resources) == {"nvidia.com/gpu": 4}


@pytest.mark.parametrize(
    ("gpus", "served", "reason", "message"),
    [
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb"), full_gpu(1)],
            {"nvidia.com/gpu": 1},
            "MigModeMixed",
            "mig-strategy single: GPUs 1 have MIG disabled while 0 have MIG enabled; serving the MIG "
            "devices, the whole GPUs are not advertised",
            id="mixed-mig-mode",
        ),
        pytest.param(
            [mig_enabled_gpu(0, "1g.5gb", "2g.10gb", "2g.10gb")],
            {"nvidia.com/gpu": 2},
            "MigProfilesMixed",
            "mig-strategy single: more than one MIG profile on the node (1g.5gb, 2g.10gb); serving "
            "2g.10gb, MIG devices of 1g.5gb are not advertised",
            id="two-profiles",
        ),
        pytest.param(
            [mig_enabled_gpu(0), mig_enabled_gpu(1, "1g.5gb")],
            {"nvidia.com/gpu": 1},
            "MigWithoutDevices",
            f"GPU 0 ({full_gpu(0).uuid}) has MIG enabled but no MIG devices yet; not advertised until they "
            "are created",
            id="empty-mig",
        ),
    ],
)
def test_single_strategy_serves_what_fits_and_names_the_rest(
    gpus: list[GpuInfo], served: dict[str, int], reason: str, message: str
) -> None:
    built = build_resources(gpus, mig_strategy="single")
    assert names(built.resources) == served
    assert [(m.reason, m.message, m.withholds) for m in built.misfits] == [(reason, message, ())]


def test_mixed_strategy_serves_the_other_gpus_beside_one_without_mig_devices() -> None:
    gpus = [mig_enabled_gpu(0), mig_enabled_gpu(1, "1g.5gb", "1g.5gb"), full_gpu(2)]
    built = build_resources(gpus, mig_strategy="mixed")
    assert names(built.resources) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 2}
    assert [(m.reason, m.subject) for m in built.misfits] == [("MigWithoutDevices", "GPU 0")]


def test_unknown_strategy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="accepted: none, single, mixed"):
        build_resources([full_gpu(0)], mig_strategy="double")


def test_patterns_rename_and_unmatched_gpu_is_left_out() -> None:
    gpus = [full_gpu(0, name="NVIDIA A100-SXM4-40GB"), full_gpu(1, name="Tesla T4")]
    patterns = [NamePattern("*A100*", "nvidia.com/a100"), NamePattern("Tesla*", "nvidia.com/t4")]
    built = build_resources(gpus, gpu_patterns=patterns)
    assert names(built.resources) == {"nvidia.com/a100": 1, "nvidia.com/t4": 1}
    assert built.misfits == ()
    built = build_resources(gpus, gpu_patterns=patterns[:1])
    assert names(built.resources) == {"nvidia.com/a100": 1}
    assert [m.message for m in built.misfits] == [
        "GPU 1 name 'Tesla T4' matches no resources.gpus pattern; not advertised"
    ]


def test_time_slicing_replicas_keep_name() -> None:
    gpus = [full_gpu(0), full_gpu(1)]
    resources = build_resources(gpus, sharing=[ReplicatedResource("nvidia.com/gpu", replicas=4)]).resources
    (shared,) = resources
    assert shared.name == "nvidia.com/gpu" and shared.sharing == "time-slicing" and len(shared.devices) == 8
    assert f"{gpus[1].uuid}::3" in shared.devices
    assert shared.devices[f"{gpus[1].uuid}::3"].replica == 3


def test_time_slicing_rename_and_subset_by_index() -> None:
    gpus = [full_gpu(0), full_gpu(1), full_gpu(2)]
    rule = ReplicatedResource(
        "nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.shared", devices=("1", gpus[2].uuid)
    )
    resources = build_resources(gpus, sharing=[rule]).resources
    assert names(resources) == {"nvidia.com/gpu": 1, "nvidia.com/gpu.shared": 4}
    shared = next(r for r in resources if r.name == "nvidia.com/gpu.shared")
    assert shared.socket_name == "nvidia-gpu.shared.sock"


@pytest.mark.parametrize(
    ("devices", "served", "message"),
    [
        pytest.param(
            5,
            {"nvidia.com/gpu": 4},
            "5 devices requested to be shared, but only 2 available; sharing those",
            id="count",
        ),
        pytest.param(
            ("1", "7"),
            {"nvidia.com/gpu": 3},
            "no device with index or UUID '7' on this node; sharing the others",
            id="index",
        ),
        pytest.param(
            ("7", "8"),
            {"nvidia.com/gpu": 2},
            "no device with index or UUID '7', '8' on this node; entry not applied",
            id="no-index",
        ),
    ],
)
def test_sharing_beyond_the_node_shares_what_it_has(
    devices: int | tuple[str, ...], served: dict[str, int], message: str
) -> None:
    built = build_resources(
        [full_gpu(0), full_gpu(1)], sharing=[ReplicatedResource("nvidia.com/gpu", 2, devices=devices)]
    )
    assert names(built.resources) == served
    assert [(m.reason, m.message) for m in built.misfits] == [
        ("SharingDevicesMissing", f"sharing.timeSlicing.resources[0]: nvidia.com/gpu: {message}")
    ]


def test_mig_minors_from_file_and_layout() -> None:
    mig = mig_device_info(1, gi_id=2)
    table = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n")
    assert mig_cap_paths(0, mig, table) == ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    assert mig_cap_paths(0, mig, None) == ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]


def _mixed(gpus: list[GpuInfo]) -> list[ReplicatedResource]:
    return [
        ReplicatedResource("nvidia.com/gpu", 2, devices=("0", "1")),
        ReplicatedResource("nvidia.com/gpu", 4, devices=(gpus[2].uuid,)),
        ReplicatedResource("nvidia.com/gpu", 1, devices=("3",)),
    ]


def test_per_gpu_replica_counts_under_one_name() -> None:
    gpus = [full_gpu(i) for i in range(5)]
    (resource,) = build_resources(gpus, sharing=_mixed(gpus)).resources
    u = [g.uuid for g in gpus]
    assert list(resource.devices) == [
        f"{u[0]}::0",
        f"{u[0]}::1",
        f"{u[1]}::0",
        f"{u[1]}::1",
        *(f"{u[2]}::{n}" for n in range(4)),
        u[3],  # replicas: 1 is not shared: no `::` ID
        u[4],  # selected by no entry: whole
    ]
    assert resource.sharing == "time-slicing"
    assert resource.replica_counts == {u[0]: 2, u[1]: 2, u[2]: 4}
    assert [resource.replicas_of(x) for x in u] == [2, 2, 4, 1, 1]
    assert resource.replicas == 2
    assert resource.allocation_policy == "distributed"


def test_unselected_gpus_stay_whole_under_the_unshared_name() -> None:
    gpus = [full_gpu(i) for i in range(4)]
    rules = [
        ReplicatedResource("nvidia.com/gpu", 2, rename="nvidia.com/gpu.shared", devices=("0",)),
        ReplicatedResource("nvidia.com/gpu", 3, rename="nvidia.com/gpu.shared", devices=("1",)),
    ]
    resources = {
        r.name: r for r in build_resources(gpus, sharing=rules, allocation_policy="packed").resources
    }
    assert names(list(resources.values())) == {"nvidia.com/gpu": 2, "nvidia.com/gpu.shared": 5}
    assert resources["nvidia.com/gpu"].sharing is None
    assert resources["nvidia.com/gpu"].allocation_policy is None  # whole GPUs: topology, not the policy
    shared = resources["nvidia.com/gpu.shared"]
    assert shared.replica_counts == {gpus[0].uuid: 2, gpus[1].uuid: 3}
    assert shared.allocation_policy == "packed"


def test_one_replica_alone_is_not_shared() -> None:
    (resource,) = build_resources(
        [full_gpu(0), full_gpu(1)], sharing=[ReplicatedResource("nvidia.com/gpu", 1)]
    ).resources
    assert list(resource.devices) == [full_gpu(0).uuid, full_gpu(1).uuid]
    assert (resource.sharing, resource.replica_counts, resource.allocation_policy) == (None, {}, None)


def test_overlapping_selections_of_one_name_leave_the_later_entry_out_naming_the_gpus() -> None:
    gpus = [full_gpu(i) for i in range(4)]
    rules = [
        ReplicatedResource("nvidia.com/gpu", 2, devices=("0", "1", "2")),
        ReplicatedResource("nvidia.com/gpu", 4, devices=(gpus[1].uuid, "3", gpus[2].uuid)),
    ]
    built = build_resources(gpus, sharing=rules)
    assert names(built.resources) == {"nvidia.com/gpu": 7}  # GPUs 0-2 x2, GPU 3 whole
    assert [m.message for m in built.misfits] == [
        "sharing.timeSlicing.resources[1]: selects GPUs 1, 2 of nvidia.com/gpu, also selected by "
        "sharing.timeSlicing.resources[0]; entries with the same name need disjoint devices; "
        "entry not applied"
    ]


def test_entry_matching_no_resource_is_not_applied_naming_what_it_could_match() -> None:
    gpus = [full_gpu(0, name="NVIDIA A100-SXM4-40GB"), full_gpu(1, name="Tesla T4")]
    patterns = [NamePattern("*A100*", "nvidia.com/a100"), NamePattern("*", "nvidia.com/other")]
    rules = [
        ReplicatedResource("nvidia.com/a100", 2),
        ReplicatedResource("nvidia.com/gpu", 2, strategy="mps"),
    ]
    built = build_resources(gpus, gpu_patterns=patterns, sharing=rules)
    assert names(built.resources) == {"nvidia.com/a100": 2, "nvidia.com/other": 1}
    assert [(m.reason, m.subject, m.message) for m in built.misfits] == [
        (
            "SharingEntryUnmatched",
            "sharing.mps.resources[1]",
            "sharing.mps.resources[1]: nvidia.com/gpu matches no resource on this node; entry not applied "
            "(it could match: nvidia.com/a100, nvidia.com/other)",
        )
    ]


def test_mig_resources_carry_the_policy() -> None:
    gpus = [mig_enabled_gpu(0, "1g.5gb", "1g.5gb"), full_gpu(1)]
    resources = {
        r.name: r for r in build_resources(gpus, mig_strategy="mixed", allocation_policy="packed").resources
    }
    assert resources["nvidia.com/mig-1g.5gb"].allocation_policy == "packed"
    assert resources["nvidia.com/gpu"].allocation_policy is None
    changed = build_resources(gpus, mig_strategy="mixed").resources
    assert {r.name: r.signature() for r in changed}["nvidia.com/gpu"] == resources[
        "nvidia.com/gpu"
    ].signature()
    assert {r.name: r.signature() for r in changed}["nvidia.com/mig-1g.5gb"] != (
        resources["nvidia.com/mig-1g.5gb"].signature()
    )
