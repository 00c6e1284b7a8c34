"""The chart grants CAP_SYS_ADMIN (and the MIG monitor devices) only where a config entry uses MIG
(issue 9 defect 9): any entry of `config.map` counts, an existing ConfigMap counts by what it holds
(read at install time), and `migCapabilities` says so where it cannot be read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests import test_deploy
from tests.test_chart_support import program_problems
from tests.test_deploy import LEAST, MIG_MIXED_ENTRY, SYS_ADMIN, Rendered, container, env_of

# test_deploy's fixtures, used here by name
renderer = test_deploy.renderer
render = test_deploy.render

SHARED_ENTRY = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)


@pytest.mark.parametrize(
    ("values", "expected", "mig_monitor"),
    [
        pytest.param(
            {"config": {"name": "my-configs", "default": "a"}}, LEAST, False, id="external-config-unread"
        ),
        pytest.param(
            {"config": {"name": "my-configs", "default": "a"}, "migCapabilities": True},
            SYS_ADMIN,
            True,
            id="external-config-said-to-use-mig",
        ),
        pytest.param(
            {"config": {"map": {"default": SHARED_ENTRY, "other": SHARED_ENTRY}}},
            LEAST,
            False,
            id="entries-without-mig",
        ),
        pytest.param(
            {"config": {"map": {"default": SHARED_ENTRY, "mig": MIG_MIXED_ENTRY}, "default": "default"}},
            SYS_ADMIN,
            True,
            id="a-non-default-entry-uses-mig",
        ),
        pytest.param(
            {"config": {"map": {"default": MIG_MIXED_ENTRY}}, "migCapabilities": False},
            LEAST,
            False,
            id="said-not-to-use-mig",
        ),
    ],
)
def test_sys_admin_only_where_mig_is_used(
    render: Callable[..., Rendered], values: dict[str, Any], expected: dict[str, Any], mig_monitor: bool
) -> None:
    daemonset = render(values).daemonset
    assert container(daemonset)["securityContext"] == expected
    assert ("NVIDIA_MIG_MONITOR_DEVICES" in env_of(daemonset)) == mig_monitor


render_error = test_deploy.render_error


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: gpu\n      replicas: 1000000000\n",
            id="as-text",
        ),
        pytest.param(
            {
                "version": "v1",
                "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1000000000}]}},
            },
            id="as-mapping",
        ),
    ],
)
def test_chart_refuses_replicas_over_the_cap_in_the_programs_words(
    render_error: Callable[..., str], entry: Any
) -> None:
    text = entry if isinstance(entry, str) else yaml.safe_dump(entry)
    (problem,) = program_problems([], text)
    assert problem.startswith("sharing.timeSlicing.resources[0].replicas: 1000000000 is over")
    assert f"config.map.big: {problem}" in render_error({"config": {"map": {"big": entry}}})


def test_chart_accepts_replicas_at_the_cap(render: Callable[..., Rendered]) -> None:
    entry = SHARED_ENTRY.replace("replicas: 4", "replicas: 1024")
    assert render({"config": {"map": {"default": entry}}}).daemonset
