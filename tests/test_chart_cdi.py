"""The chart with a CDI device-list strategy: the host's /var/run/cdi and the driver root mounted,
the CDI env vars passed; nothing of it without such a strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests import test_deploy
from tests.test_deploy import Rendered, check_plugin_daemonset, env_of, mounts_of, volume

# test_deploy's fixtures, used here by name
renderer = test_deploy.renderer
render = test_deploy.render


def volumes(out: Rendered) -> set[str]:
    return {v["name"] for v in out.daemonset["spec"]["template"]["spec"].get("volumes", [])}


def test_no_cdi_mounts_without_a_cdi_strategy(render: Callable[..., Rendered]) -> None:
    out = render({"deviceListStrategy": "envvar"})
    assert "cdi-specs" not in volumes(out) and "driver-root" not in volumes(out)
    assert env_of(out.daemonset)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize(
    ("values", "driver_root"),
    [
        pytest.param({"deviceListStrategy": "cdi-cri"}, "/", id="value-default-driver-root"),
        pytest.param(
            {"deviceListStrategy": "envvar,cdi-annotations", "nvidiaDriverRoot": "/run/nvidia/driver"},
            "/run/nvidia/driver",
            id="value-operator-driver-root",
        ),
        pytest.param(
            {
                "config": {
                    "map": {
                        "default": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["cdi-cri"]}}}
                    }
                }
            },
            "/",
            id="config-map-list",
        ),
    ],
)
def test_cdi_strategy_mounts_spec_dir_and_driver_root(
    render: Callable[..., Rendered], values: dict[str, Any], driver_root: str
) -> None:
    daemonset = render(values).daemonset
    check_plugin_daemonset(daemonset)
    assert volume(daemonset, "cdi-specs")["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    assert mounts_of(daemonset)["cdi-specs"] == {"name": "cdi-specs", "mountPath": "/var/run/cdi"}
    assert volume(daemonset, "driver-root")["hostPath"] == {"path": driver_root, "type": "Directory"}
    assert mounts_of(daemonset)["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
    }
    assert env_of(daemonset)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def test_cdi_values_become_env(render: Callable[..., Rendered]) -> None:
    values = {
        "deviceListStrategy": "cdi-cri",
        "cdi": {
            "disableHooks": "update-ldcache",
            "kind": "nvidia.com/gpu",
            "nvidiaHookPath": "/usr/bin/nvidia-cdi-hook",
        },
    }
    env = env_of(render(values).daemonset)
    assert (env["CDI_DISABLE_HOOKS"], env["CDI_KIND"], env["NVIDIA_CDI_HOOK_PATH"]) == (
        "update-ldcache",
        "nvidia.com/gpu",
        "/usr/bin/nvidia-cdi-hook",
    )
