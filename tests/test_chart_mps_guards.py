"""The chart refuses the MPS configs the program refuses from the config alone, in the program's
words (nvdp/config/rules.py, nvdp/config/load.py): more replicas
than MPS takes, MPS with the mixed MIG strategy, MIG devices named in `devices`, and time-slicing
and MPS together."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import test_deploy
from tests.test_chart_support import program_problems
from tests.test_deploy import Doc

# test_deploy's Helm fixtures, shared by name.
renderer, render, render_error = test_deploy.renderer, test_deploy.render, test_deploy.render_error

MPS_ROOT = ["--mps-root", "/run/nvidia/mps"]  # the chart sets MPS_ROOT; the program needs one


def mps(replicas: int = 4, devices: str = "", flags: str = "") -> str:
    entry = f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n" + (
        f"      devices: {devices}\n" if devices else ""
    )
    return f"version: v1\n{flags}sharing:\n  mps:\n    resources:\n{entry}"


@pytest.mark.parametrize(
    ("values", "argv", "file", "chart_says"),
    [
        pytest.param(
            {"config": {"map": {"default": mps(49)}}},
            MPS_ROOT,
            mps(49),
            "config.map.default: sharing.mps.resources[0].replicas: 49 is more than MPS supports "
            "(48 clients per GPU)",
            id="replicas",
        ),
        pytest.param(
            {"config": {"map": {"default": mps(devices="[0, '1:0']")}}},
            MPS_ROOT,
            mps(devices="[0, '1:0']"),
            "config.map.default: sharing.mps.resources[0].devices: '1:0' is a MIG device; "
            "MPS shares whole GPUs only",
            id="mig-index",
        ),
        pytest.param(
            {"config": {"map": {"default": mps(devices="[MIG-1c6f3a6e-0d2e-4f9b-8c5a-6d9e7f1a2b3c]")}}},
            MPS_ROOT,
            mps(devices="[MIG-1c6f3a6e-0d2e-4f9b-8c5a-6d9e7f1a2b3c]"),
            "config.map.default: sharing.mps.resources[0].devices: "
            "'MIG-1c6f3a6e-0d2e-4f9b-8c5a-6d9e7f1a2b3c' is a MIG device; MPS shares whole GPUs only",
            id="mig-uuid",
        ),
        pytest.param(
            {"config": {"map": {"default": mps(flags="flags:\n  migStrategy: mixed\n")}}},
            MPS_ROOT,
            mps(flags="flags:\n  migStrategy: mixed\n"),
            'config.map.default: sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
            "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)",
            id="mixed-in-entry",
        ),
        pytest.param(
            {"migStrategy": "mixed", "config": {"map": {"default": mps()}}},
            [*MPS_ROOT, "--mig-strategy", "mixed"],
            mps(),
            'config.map.default: sharing.mps: MPS sharing is not supported with MIG strategy "mixed" '
            "(--mig-strategy / MIG_STRATEGY / flags.migStrategy)",
            id="mixed-value",
        ),
        pytest.param(
            {
                "config": {
                    "map": {
                        "plain": "version: v1\n",
                        "both": mps() + "  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n",
                    },
                    "default": "plain",
                }
            },
            MPS_ROOT,
            mps() + "  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n",
            "config.map.both: sharing: timeSlicing and mps are mutually exclusive; configure only one",
            id="time-slicing-and-mps",
        ),
    ],
)
def test_chart_refuses_mps_as_the_program_does(
    render_error: Callable[..., str], values: Doc, argv: list[str], file: str, chart_says: str
) -> None:
    assert chart_says in render_error(values)
    # the program's line for the same file: the chart's without `config.map.<entry>: `
    # (the program names the file instead where the loader refuses it)
    said = chart_says.split(": ", 1)[1]
    assert any(p == said or p.endswith(": " + said) for p in program_problems(argv, file))


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"config": {"map": {"default": mps(48)}}}, id="48-replicas"),
        pytest.param({"config": {"map": {"default": mps(devices="[0, 1, GPU-abc]")}}}, id="gpus"),
        # the chart's migStrategy overrides the entry's, as MIG_STRATEGY overrides flags.migStrategy
        pytest.param(
            {
                "migStrategy": "single",
                "config": {"map": {"default": mps(flags="flags: {migStrategy: mixed}\n")}},
            },
            id="value-overrides-entry",
        ),
    ],
)
def test_chart_accepts_mps_the_program_accepts(render: Callable[..., object], values: Doc) -> None:
    assert render(values)
