"""The chart with MPS configured (real Helm engine): NVIDIA's MPS control daemon DaemonSet, the
plugin's MPS_ROOT and root mount only then, and every object valid against the Kubernetes schemas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests import test_deploy as deploy
from tests.test_deploy import CONTAINER, Rendered, check_plugin_daemonset, check_schema

renderer = deploy.renderer  # fixtures shared with the chart's main tests
render = deploy.render

MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
PLAIN_ENTRY = "version: v1\nflags:\n  migStrategy: none\n"

Doc = dict[str, Any]


def daemonsets(out: Rendered) -> dict[str, Doc]:
    return {
        d["spec"]["template"]["spec"]["containers"][0]["name"]: d
        for d in out.docs
        if d["kind"] == "DaemonSet"
    }


def env(ctr: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


def test_chart_with_mps_renders_the_control_daemon(render: Callable[..., Rendered]) -> None:
    out = render({"config": {"map": {"default": PLAIN_ENTRY, "mps": MPS_ENTRY}, "default": "mps"}})
    sets = daemonsets(out)
    assert sorted(sets) == ["mps-control-daemon-ctr", CONTAINER]
    plugin, mps = sets[CONTAINER], sets["mps-control-daemon-ctr"]
    check_plugin_daemonset(plugin)
    for doc in out.docs:
        check_schema(doc)
    # the plugin: MPS_ROOT and the root, read-only, at the host path
    ctr = plugin["spec"]["template"]["spec"]["containers"][0]
    assert env(ctr)["MPS_ROOT"] == "/run/nvidia/mps"
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "mps-root")
    assert mount == {"name": "mps-root", "mountPath": "/run/nvidia/mps", "readOnly": True}
    volumes = {v["name"]: v for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert volumes["mps-root"]["hostPath"] == {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}
    # the control daemon: selector apart from the plugin's, node selector, privileges, mounts
    assert mps["spec"]["selector"]["matchLabels"] != plugin["spec"]["selector"]["matchLabels"]
    pod = mps["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    assert pod["hostPID"] is True
    (init,) = pod["initContainers"]
    assert init["command"] == ["nvdp", "mps-control-daemon", "mount-shm"]
    assert init["securityContext"] == {"privileged": True}
    assert init["volumeMounts"][0]["mountPropagation"] == "Bidirectional"
    (daemon,) = pod["containers"]
    assert daemon["command"] == ["nvdp", "mps-control-daemon"]
    assert daemon["securityContext"] == {
        "runAsUser": 0,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
    }
    assert env(daemon) == {
        "MPS_ROOT": "/run/nvidia/mps",
        "CONFIG_FILE": "/config/config.yaml",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    assert mounts == {"mps-root": "/run/nvidia/mps", "mps-shm": "/dev/shm", "config": "/config"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["mps-shm"]["hostPath"]["path"] == "/run/nvidia/mps/shm"
    assert volumes["config"]["configMap"]["items"] == [{"key": "mps", "path": "config.yaml"}]


@pytest.mark.parametrize(
    ("values", "rendered"),
    [
        pytest.param({}, False, id="no-config"),
        pytest.param({"config": {"map": {"default": PLAIN_ENTRY}}}, False, id="no-mps-entry"),
        pytest.param(
            {"config": {"map": {"default": PLAIN_ENTRY}}, "mps": {"enabled": True}}, True, id="forced"
        ),
        pytest.param(
            {"config": {"map": {"default": MPS_ENTRY}}, "mps": {"enabled": False}}, False, id="switched-off"
        ),
        pytest.param(
            {
                "config": {
                    "map": {
                        "default": {
                            "version": "v1",
                            "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}},
                        }
                    }
                }
            },
            True,
            id="entry-as-mapping",
        ),
    ],
)
def test_mps_parts_only_when_mps_is_configured(
    render: Callable[..., Rendered], values: Doc, rendered: bool
) -> None:
    out = render(values)
    sets = daemonsets(out)
    assert ("mps-control-daemon-ctr" in sets) is rendered
    ctr = sets[CONTAINER]["spec"]["template"]["spec"]["containers"][0]
    assert ("MPS_ROOT" in env(ctr)) is rendered
    assert any(m["name"] == "mps-root" for m in ctr["volumeMounts"]) is rendered


def test_mps_root_and_security_context_values(render: Callable[..., Rendered]) -> None:
    out = render(
        {
            "config": {"map": {"default": MPS_ENTRY}},
            "mps": {"root": "/var/run/mps", "securityContext": {"privileged": True}},
            "nvidiaDriverRoot": "/run/nvidia/driver",
        }
    )
    daemon = daemonsets(out)["mps-control-daemon-ctr"]["spec"]["template"]["spec"]["containers"][0]
    assert daemon["securityContext"] == {"privileged": True}
    assert env(daemon)["MPS_ROOT"] == "/var/run/mps"
    assert env(daemon)["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
    for doc in out.docs:
        check_schema(doc)


def test_static_mps_manifest_matches_the_chart(render: Callable[..., Rendered]) -> None:
    static = deploy.load_docs(
        (deploy.ROOT / "deployments" / "static" / "nvidia-device-plugin-mps.yml").read_text()
    )
    assert deploy.kinds(static) == ["ConfigMap", "DaemonSet"]
    for doc in static:
        check_schema(doc)
    assert "sharing" in deploy.yaml.safe_load(deploy.only(static, "ConfigMap")["data"]["config.yaml"])
    chart = daemonsets(render({"config": {"map": {"default": MPS_ENTRY}}}))["mps-control-daemon-ctr"]
    ours = deploy.only(static, "DaemonSet")["spec"]["template"]["spec"]
    theirs = chart["spec"]["template"]["spec"]
    for key in ("hostPID", "nodeSelector", "priorityClassName"):
        assert ours[key] == theirs[key], key
    for ctr_key in ("initContainers", "containers"):
        for a, b in zip(ours[ctr_key], theirs[ctr_key], strict=True):
            assert (a["command"], a["securityContext"]) == (b["command"], b["securityContext"])
            assert env(a) == env(b)
            assert [(m["mountPath"], m.get("mountPropagation")) for m in a["volumeMounts"]] == [
                (m["mountPath"], m.get("mountPropagation")) for m in b["volumeMounts"]
            ]
