"""The chart refuses what the plugin refuses, in the same words (nvdp/config/rules.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config import add_plugin_flags, parse_text, resolve
from nvdp.config.rules import TEGRA_UNSUPPORTED
from tests import test_deploy
from tests.test_deploy import Doc

# test_deploy's Helm fixtures, shared by name.
renderer, render, render_error = test_deploy.renderer, test_deploy.render, test_deploy.render_error

TEGRA_ENTRY = "version: v1\nflags:\n  deviceDiscoveryStrategy: tegra\n"


def reason(problem: str) -> str:
    """A refusal without the name of the setting (that differs: flag / env var vs chart value)."""
    return problem.split(": ", 1)[1] if problem.startswith("--") else problem


def program_problems(argv: list[str], file: str | None = None) -> list[str]:
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    env = {"CONFIG_FILE": "config.yaml"} if file is not None else {}
    with pytest.raises(ConfigError) as caught:
        resolve(parser.parse_args(argv), env, file_loader=lambda path: parse_text(file or "", path))
    return caught.value.problems


@pytest.mark.parametrize(
    ("values", "argv", "file", "chart_says"),
    [
        pytest.param(
            {"deviceDiscoveryStrategy": "tegra"},
            ["--device-discovery-strategy", "tegra"],
            None,
            "deviceDiscoveryStrategy: " + reason(TEGRA_UNSUPPORTED),
            id="tegra-value",
        ),
        pytest.param(
            {"config": {"map": {"default": TEGRA_ENTRY}}},
            [],
            TEGRA_ENTRY,
            "config.map.default: flags.deviceDiscoveryStrategy: " + reason(TEGRA_UNSUPPORTED),
            id="tegra-in-config",
        ),
    ],
)
def test_chart_and_program_refuse_alike(
    render_error: Callable[..., str], values: Doc, argv: list[str], file: str | None, chart_says: str
) -> None:
    said = render_error(values)
    assert chart_says in said
    assert any(chart_says.endswith(reason(p)) for p in program_problems(argv, file))


@pytest.mark.parametrize("strategy", ["auto", "nvml"])
def test_chart_accepts_what_the_program_accepts(render: Callable[..., object], strategy: str) -> None:
    assert render({"deviceDiscoveryStrategy": strategy})
