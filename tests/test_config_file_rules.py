"""The plugin's support rules applied to config files on their own: `nvdp config check` reports, and
the config-manager never links, an entry the plugin would refuse; a setting the plugin's flags or env
vars may supply (an MPS root) is not required of a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvdp.cli import main
from nvdp.config import parse_text
from nvdp.config.rules import TEGRA_UNSUPPORTED, file_problems, plugin_problems
from tests.test_config_manager_rules import _manager

TEGRA = "flags: {deviceDiscoveryStrategy: tegra}\n"
MPS_NO_ROOT = "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"


def test_file_rules_keep_what_the_file_states_and_drop_what_flags_supply() -> None:
    assert file_problems(parse_text(TEGRA)) == [TEGRA_UNSUPPORTED]
    mps = parse_text(MPS_NO_ROOT)
    assert any("MPS root" in p for p in plugin_problems(mps)), "resolved: the MPS root is required"
    assert not any("MPS root" in p for p in file_problems(mps)), "a file: MPS_ROOT / --mps-root may give it"
    assert file_problems(parse_text("version: v1\n")) == []


@pytest.mark.parametrize("nvml", [[], ["--nvml", "sim:pcie-4"]], ids=["parse", "resources"])
def test_config_check_reports_what_the_plugin_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nvml: list[str]
) -> None:
    (tmp_path / "tegra").write_text(TEGRA)
    (tmp_path / "plain").write_text("version: v1\n")
    assert main(["config", "check", str(tmp_path), *nvml]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines() == [f"error: {tmp_path}/tegra: {TEGRA_UNSUPPORTED}"]
    assert out.out.startswith(f"{tmp_path}/plain: ok")


def test_config_manager_never_links_an_entry_the_plugin_refuses(tmp_path: Path) -> None:
    manager, events, dst = _manager(tmp_path)
    (tmp_path / "src" / "tegra").write_text(TEGRA)
    manager.set_labels({"nvidia.com/device-plugin.config": "a"})
    assert manager.reconcile().changed
    manager.set_labels({"nvidia.com/device-plugin.config": "tegra"})
    outcome = manager.reconcile()
    assert not outcome.changed and outcome.entry == "a" and os.readlink(dst).endswith("/src/a")
    assert outcome.problem == f"tegra: {TEGRA_UNSUPPORTED}"
    assert [e[1] for e in events.posted] == ["DevicePluginConfigRefused"]
