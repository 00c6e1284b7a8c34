"""Config keys in any letter case where NVIDIA's plugin reads them so (Go's encoding/json: the schema's
spelling, else the same key but for case), and in nvdp's own sections: applied, with one NOTICE line
per key naming the schema's spelling, at the plugin's start (through the logger, JSON under
`--log-format json`) and in `nvdp config check`. Two spellings of one key in one mapping are refused
with one line. The sections NVIDIA decodes by exact key (sharing.timeSlicing / mps and their
resources, resources.gpus / mig entries) take exact keys, as there."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdp.base.errors import ConfigError
from nvdp.cli import main
from nvdp.config import load_file, parse, parse_text
from nvdp.config.notices import migration_notices
from nvdp.sim.kubelet import Kubelet
from testkit import start_plugin

DATA = Path(__file__).parent / "data" / "config"
ANY_CASE = "(NVIDIA's plugin matches keys in any letter case)"
TIMESLICING = "sharing: {timeslicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n"
TIMESLICING_NOTICE = f"sharing.timeslicing: applied as sharing.timeSlicing {ANY_CASE}"


# The keys whose value NVIDIA's plugin decodes by exact key (its own UnmarshalJSON methods).
EXACT_BELOW = {"timeSlicing", "mps", "gpus", "mig"}


def recased(data: object, spell: Any, exact: bool = False) -> tuple[object, int]:
    """`data` with every key NVIDIA reads in any case respelled by `spell`, and how many changed."""
    if isinstance(data, dict):
        out, changed = {}, 0
        for key, value in data.items():
            inner, n = recased(value, spell, exact or key in EXACT_BELOW)
            written = key if exact else spell(key)
            out[written] = inner
            changed += n + (written != key)
        return out, changed
    if isinstance(data, list):
        items = [recased(item, spell, exact) for item in data]
        return [item for item, _ in items], sum(n for _, n in items)
    return data, 0


SPELLINGS = {"lower": str.lower, "upper": str.upper, "title": lambda k: k[:1].upper() + k[1:]}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.*") if p.stat().st_size))
def test_example_files_read_the_same_in_any_letter_case(name: str, spelling: str) -> None:
    """NVIDIA's documented files (README v0.20.0: plain, time-slicing, MPS, renameByDefault; its chart's
    MIG example) and nvdp's, every key respelled."""
    text = (DATA / name).read_text()
    original = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    data, changed = recased(original, SPELLINGS[spelling])
    config = parse(data, strict=True)  # strict: a recased key is no unknown key
    assert config == parse(original)
    assert config.to_dict() == parse(original).to_dict()
    notices = [line for line in migration_notices(config) if line.endswith(ANY_CASE)]
    assert len(config.recased_keys) == changed and len(notices) == min(changed, 20)
    for written, schema in config.recased_keys:
        assert written.lower() == schema.lower() and written != schema


@pytest.mark.parametrize(
    ("text", "read", "expected", "notices"),
    [
        (TIMESLICING, lambda c: c.sharing.time_slicing.resources[0].replicas, 4, [TIMESLICING_NOTICE]),
        (
            "Sharing:\n  TimeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n"
            "RESOURCES: {GPUs: [{pattern: '*', name: gpu}]}\nImex: {channelids: [0]}\n",
            lambda c: (c.sharing.entries[0].replicas, c.resources.gpus[0].name, c.imex.channel_ids),
            (2, "nvidia.com/gpu", (0,)),
            [
                f"Sharing: applied as sharing {ANY_CASE}",
                f"RESOURCES: applied as resources {ANY_CASE}",
                f"Imex: applied as imex {ANY_CASE}",
                f"resources.GPUs: applied as resources.gpus {ANY_CASE}",
                f"sharing.TimeSlicing: applied as sharing.timeSlicing {ANY_CASE}",
                f"imex.channelids: applied as imex.channelIDs {ANY_CASE}",
                "resources.gpus[0]: NVIDIA's plugin ignores this; nvdp applies it: GPUs whose product name "
                "matches '*' are advertised as nvidia.com/gpu (NVIDIA's: nvidia.com/gpu)",
            ],
        ),
        (
            "Flags: {Plugin: {DeviceIDStrategy: index}, GFD: {OneShot: true}}\n",
            lambda c: (c.flags.plugin.device_id_strategy, c.flags.gfd.oneshot),
            ("index", True),
            [
                f"Flags: applied as flags {ANY_CASE}",
                f"flags.Plugin: applied as flags.plugin {ANY_CASE}",
                f"flags.GFD: applied as flags.gfd {ANY_CASE}",
                f"flags.plugin.DeviceIDStrategy: applied as flags.plugin.deviceIDStrategy {ANY_CASE}",
                f"flags.gfd.OneShot: applied as flags.gfd.oneshot {ANY_CASE}",
            ],
        ),
        (
            "flags: {MigStrategy: single}\n",
            lambda c: c.flags.mig_strategy,
            "single",
            [f"flags.MigStrategy: applied as flags.migStrategy {ANY_CASE}"],
        ),
        (
            "health: {IGNOREDXIDS: [13]}\n",  # nvdp's own sections fold too: one rule
            lambda c: c.health.ignored_xids,
            (13,),
            [f"health.IGNOREDXIDS: applied as health.ignoredXids {ANY_CASE}"],
        ),
        (
            "flags: {plugin: {\u212aubeletSocket: /k/kubelet.sock}}\n",  # KELVIN SIGN folds to k in Go
            lambda c: c.flags.plugin.kubelet_socket,
            "/k/kubelet.sock",
            [f"flags.plugin.\u212aubeletSocket: applied as flags.plugin.kubeletSocket {ANY_CASE}"],
        ),
    ],
    ids=["issue-timeslicing", "top-sections", "flags", "mig-strategy", "nvdp-health", "go-kelvin-fold"],
)
def test_a_recased_key_is_applied_with_one_notice(
    text: str, read: Any, expected: object, notices: list[str]
) -> None:
    config = parse_text(text, strict=True)
    assert read(config) == expected
    assert migration_notices(config) == notices


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "sharing:\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n"
            "  timeslicing: {resources: [{name: gpu, replicas: 3}]}\n",
            "sharing.timeSlicing: given twice, as timeSlicing and timeslicing (keys match in any letter case,"
            " as in NVIDIA's plugin); keep one",
        ),
        (
            "flags: {migstrategy: single, MIGSTRATEGY: mixed}\n",
            "flags.migStrategy: given twice, as migstrategy and MIGSTRATEGY (keys match in any letter case,"
            " as in NVIDIA's plugin); keep one",
        ),
    ],
    ids=["exact-and-folded", "two-folded"],
)
def test_two_spellings_of_one_key_are_refused(text: str, problem: str) -> None:
    for strict in (False, True):
        with pytest.raises(ConfigError) as raised:
            parse_text(text, strict=strict)
        assert raised.value.problems == [problem]


def test_only_case_folds_not_lookalikes(caplog: pytest.LogCaptureFixture) -> None:
    """A key that is not the schema's but for case stays unknown (a WARNING; strict: refused)."""
    with caplog.at_level(logging.WARNING):
        config = parse_text("flags: {mig_strategy: single}\n")
    assert config.flags.mig_strategy == "none" and config.recased_keys == ()
    assert [r.getMessage() for r in caplog.records] == [
        "flags.mig_strategy: unknown field (did you mean migStrategy?); ignored (--strict-config refuses it)"
    ]


def test_a_misplaced_key_in_another_case_says_where_it_belongs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parse_text("flags: {RenameByDefault: true}\n")
    assert [r.getMessage() for r in caplog.records] == [
        "flags.RenameByDefault: unknown field (RenameByDefault belongs under sharing.timeSlicing or under "
        "sharing.mps); ignored (--strict-config refuses it)"
    ]


def test_a_file_of_recased_top_level_keys_is_a_config() -> None:
    assert parse_text("VERSION: v1\nSHARING: {}\n").recased_keys == (
        ("VERSION", "version"),
        ("SHARING", "sharing"),
    )


def test_config_check_prints_the_notice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(TIMESLICING)
    assert main(["config", "check", str(path), "--nvml", "sim:dgx-a100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  nvidia.com/gpu: 32 device(s) time-slicing x4"
    assert out[-1] == f"  notice: {TIMESLICING_NOTICE}"
    assert load_file(path).recased_keys == (("sharing.timeslicing", "sharing.timeSlicing"),)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_plugin_serves_the_recased_sharing_and_logs_one_notice(
    sock_dir: Path, kubelet: Kubelet, log_format: str
) -> None:
    """The issue's case: NVIDIA's plugin serves 32 replicas on a DGX A100, so does nvdp (not 8 whole
    GPUs); the NOTICE is one line, JSON with its level under --log-format json. The config file also has
    an unknown key: that WARNING, logged while the settings are resolved, is formatted as well."""
    config = sock_dir / "config.yaml"
    config.write_text(TIMESLICING + "flags: {renameByDefault: true}\n")
    extra = ["--log-format", log_format]
    with start_plugin(sock_dir, "sim:dgx-a100", config_file=config, extra=extra) as plugin:
        devices = kubelet.wait_for_devices("nvidia.com/gpu", lambda d: len(d) == 32, timeout=30)
        assert len(devices) == 32
        lines = plugin.log().splitlines()
    notices = [line for line in lines if TIMESLICING_NOTICE in line]
    warnings = [line for line in lines if "flags.renameByDefault: unknown field" in line]
    assert len(notices) == 1 and len(warnings) == 1, lines
    if log_format == "json":
        notice, warning = json.loads(notices[0]), json.loads(warnings[0])
        assert (notice["level"], notice["msg"], notice["config_file"]) == (
            "notice",
            TIMESLICING_NOTICE,
            str(config),
        )
        assert warning["level"] == "warning" and "time" in warning
    else:
        assert " NOTICE  sharing.timeslicing: applied as" in notices[0]
        assert " WARNING " in warnings[0] and warnings[0][:4].isdigit()  # a timestamp first


EXACT = "NVIDIA's plugin reads the keys of this section in their exact case"


def test_an_optional_key_of_an_exact_section_is_ignored_as_there(caplog: pytest.LogCaptureFixture) -> None:
    """NVIDIA's plugin ignores `RenameByDefault` (its map lookup misses it): the replicas keep the name
    nvidia.com/gpu there, so here too, with one WARNING saying why."""
    text = "sharing: {timeSlicing: {RenameByDefault: true, resources: [{name: gpu, replicas: 2}]}}\n"
    with caplog.at_level(logging.WARNING):
        config = parse_text(text)
    assert config.sharing.entries[0].advertised_name == "nvidia.com/gpu" and config.recased_keys == ()
    assert [r.getMessage() for r in caplog.records] == [
        f"sharing.timeSlicing.RenameByDefault: unknown field (did you mean renameByDefault? {EXACT}); ignored"
        " (--strict-config refuses it)"
    ]


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, Replicas: 2}]}}\n",
            [
                "sharing.timeSlicing.resources[0].replicas: required field is missing",
                f"sharing.timeSlicing.resources[0].Replicas: unknown field (did you mean replicas? {EXACT})",
            ],
        ),
        (
            "sharing: {mps: {Resources: [{name: gpu, replicas: 2}]}}\n",
            [
                "sharing.mps.resources: must list at least one resource",
                f"sharing.mps.Resources: unknown field (did you mean resources? {EXACT})",
            ],
        ),
        (
            "resources: {gpus: [{Pattern: '*', name: gpu}]}\n",
            [
                "resources.gpus[0].pattern: required field is missing",
                f"resources.gpus[0].Pattern: unknown field (did you mean pattern? {EXACT})",
            ],
        ),
    ],
    ids=["replicas", "mps-resources", "gpus-pattern"],
)
def test_a_required_key_of_an_exact_section_refuses_the_file_as_there(text: str, problems: list[str]) -> None:
    """NVIDIA's plugin refuses these files too ("no replicas specified", "no resources specified",
    "resources must have a 'pattern' field set"); the mis-cased key is named with the refusal."""
    with pytest.raises(ConfigError) as raised:
        parse_text(text)
    assert raised.value.problems == problems
