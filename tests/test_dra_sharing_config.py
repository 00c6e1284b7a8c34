"""`dra.consumableCapacity` and `dra.dynamicMig`: their form (one line each, at every command that
reads the file and in `nvdp config check`) and what they make of a node's GPUs (`dra_sharing`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.cli import main
from nvdp.config import parse_text
from nvdp.config.model import DRA_ALL, DRA_NONE
from nvdp.config.rules import dra_problems
from nvdp.node.gpus.inventory import DraSharing, dra_sharing
from nvdp.plugins.dra.options import add_dra_flags, resolve_dra
from tests.builders import sim_gpus

ONE_WAY = "a GPU is shared by capacity or partitioned by MIG, not both"

A100 = sim_gpus("dgx-a100")
MIG = sim_gpus("dgx-a100-mig")  # MIG mode on GPUs 0-3 only


def test_both_default_to_none_and_take_all_or_gpus() -> None:
    dra = parse_text("version: v1\n").dra
    assert (dra.consumable_capacity, dra.dynamic_mig) == (DRA_NONE, DRA_NONE)
    dra = parse_text(f"dra: {{devices: all, consumableCapacity: [0, {A100[1].uuid}], dynamicMig: all}}").dra
    assert dra.consumable_capacity == ("0", A100[1].uuid)
    assert dra.dynamic_mig == DRA_ALL


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "dra: {consumableCapacity: some}",
            'dra.consumableCapacity: must be "all", "none" or a list of GPUs, got "some"',
        ),
        (
            "dra: {dynamicMig: [0, '0:1']}",
            'dra.dynamicMig[1]: "0:1" is not a GPU index or a GPU UUID (DRA takes whole GPUs)',
        ),
        ("dra: {dynamicMig: [2, '2']}", "dra.dynamicMig: names GPU 2 more than once"),
    ],
)
def test_a_bad_value_is_one_line(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_text(text)
    assert str(raised.value) == problem


@pytest.mark.parametrize(
    "dra, problems",
    [
        ("{consumableCapacity: all, dynamicMig: none}", []),
        ("{consumableCapacity: [0, 1], dynamicMig: [2, 3]}", []),
        (
            "{consumableCapacity: all, dynamicMig: all}",
            [f'dra: consumableCapacity and dynamicMig are both "all"; {ONE_WAY}'],
        ),
        (
            "{consumableCapacity: all, dynamicMig: [3]}",
            [f'dra.dynamicMig: names GPUs while dra.consumableCapacity is "all"; {ONE_WAY}'],
        ),
        (
            "{consumableCapacity: [1, 3], dynamicMig: [3, 0, 1]}",
            [
                f"dra.dynamicMig: GPU 3 is also in dra.consumableCapacity; {ONE_WAY}",
                f"dra.dynamicMig: GPU 1 is also in dra.consumableCapacity; {ONE_WAY}",
            ],
        ),
    ],
)
def test_a_gpu_in_both_is_a_form_error(dra: str, problems: list[str]) -> None:
    assert dra_problems(parse_text(f"dra: {dra}")) == problems


def test_config_check_refuses_a_gpu_in_both_and_lists_each_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("dra: {devices: all, consumableCapacity: [1], dynamicMig: ['1']}\n")
    good = tmp_path / "good.yaml"
    good.write_text("dra: {devices: all, consumableCapacity: [5, 9], dynamicMig: [0, 1, 2, 3, 4]}\n")
    assert main(["config", "check", str(good), "--nvml", "sim:dgx-a100-mig"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{good}: ok, 0 resource(s) (migStrategy none)",
        "  DRA (8 GPU(s), not the device plugin's): GPU 0, 1, 2, 3, 4, 5, 6, 7",
        "  DRA shared by capacity: GPU 5",
        "  DRA MIG on demand: GPU 0, 1, 2, 3",
        "  warning: dra.consumableCapacity: no GPU 9 on this node; left out",
        "  warning: dra.dynamicMig: GPU 4 left out: MIG mode is off (the plugin never changes it)",
    ]
    assert main(["config", "check", str(bad)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {bad}: dra.dynamicMig: GPU 1 is also in dra.consumableCapacity; "
        "a GPU is shared by capacity or partitioned by MIG, not both"
    ]


def test_the_dra_plugin_refuses_a_gpu_in_both_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("dra: {devices: all, consumableCapacity: all, dynamicMig: all}\n")
    parser = argparse.ArgumentParser()
    add_dra_flags(parser)
    with pytest.raises(ConfigError) as raised:
        resolve_dra(parser.parse_args(["--config-file", str(config)]), {"NODE_NAME": "node-a"})
    assert 'dra: consumableCapacity and dynamicMig are both "all"' in str(raised.value)


def test_only_the_dra_drivers_gpus_are_shared_and_dynamic_mig_needs_mig_mode() -> None:
    dra = parse_text("dra: {devices: [0, 1, 4, 5], consumableCapacity: [5, 6], dynamicMig: all}").dra
    sharing, misfits = dra_sharing(dra, MIG)
    assert sharing == DraSharing(
        capacity=frozenset({MIG[5].uuid}), dynamic_mig=frozenset({MIG[0].uuid, MIG[1].uuid})
    )
    assert [m.message for m in misfits] == [
        "dra.consumableCapacity: GPU 6 left out: it is not the DRA driver's (dra.devices)",
        "dra.dynamicMig: GPU 4 left out: MIG mode is off (the plugin never changes it)",
        "dra.dynamicMig: GPU 5 left out: MIG mode is off (the plugin never changes it)",
    ]
    assert {m.reason for m in misfits} == {"DraSharingMisfit"}


def test_an_index_and_its_uuid_in_both_serve_the_gpu_whole() -> None:
    dra = parse_text(f"dra: {{devices: all, consumableCapacity: [0, 2], dynamicMig: ['{MIG[0].uuid}']}}").dra
    sharing, misfits = dra_sharing(dra, MIG)
    assert sharing == DraSharing(capacity=frozenset({MIG[2].uuid}))
    assert [m.message for m in misfits] == [
        "dra: GPU 0 is in both consumableCapacity and dynamicMig; served whole"
    ]


def test_dynamic_mig_leaves_out_a_gpu_that_is_not_mig_capable() -> None:
    gpus = sim_gpus("pcie-4")
    sharing, misfits = dra_sharing(parse_text("dra: {devices: all, dynamicMig: [0]}").dra, gpus)
    assert not gpus[0].mig_capable and sharing == DraSharing()
    assert [m.message for m in misfits] == ["dra.dynamicMig: GPU 0 left out: it is not MIG-capable"]
