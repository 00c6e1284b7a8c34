"""The supervisor's reload decision (`nvdp.plugins.deviceplugin.converge.plan_servers`), table-tested."""

from __future__ import annotations

import pytest

from nvdp.plugins.deviceplugin.converge import ServerPlan, plan_servers

A, B, C = "nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared"


@pytest.mark.parametrize(
    ("running", "wanted", "options", "expected"),
    [
        pytest.param({}, {A: 1}, "o", ServerPlan(start=(A,)), id="first-apply"),
        pytest.param({A: (1, "o")}, {A: 1}, "o", ServerPlan(), id="nothing-changed"),
        pytest.param({A: (1, "o")}, {A: 2}, "o", ServerPlan(update=(A,)), id="new-devices-same-options"),
        pytest.param({A: (1, "o")}, {A: 1}, "p", ServerPlan(restart=(A,)), id="new-options"),
        pytest.param({A: (1, "o")}, {A: 2}, "p", ServerPlan(restart=(A,)), id="new-devices-and-options"),
        pytest.param({A: (1, "o")}, {}, "o", ServerPlan(stop=(A,)), id="gone"),
        pytest.param(
            {A: (1, "o"), B: (1, "o")},
            {A: 2, C: 1},
            "o",
            ServerPlan(update=(A,), start=(C,), stop=(B,)),
            id="mixed",
        ),
    ],
)
def test_plan(
    running: dict[str, tuple[int, str]], wanted: dict[str, int], options: str, expected: ServerPlan
) -> None:
    assert plan_servers(running, wanted, options) == expected
