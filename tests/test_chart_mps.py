"""The chart with MPS configured (real Helm engine): NVIDIA's MPS control daemon DaemonSet, the
plugin's MPS_ROOT and root mount only then, and every object valid against the Kubernetes schemas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests import test_deploy as deploy
from tests.test_deploy import (
    CONTAINER,
    Rendered,
    check_plugin_daemonset,
    check_schema,
    container_env,
    without,
)

renderer = deploy.renderer  # fixtures shared with the chart's main tests
render = deploy.render

MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
PLAIN_ENTRY = "version: v1\nflags:\n  migStrategy: none\n"

Doc = dict[str, Any]


def daemonsets_by_container(out: Rendered) -> dict[str, Doc]:
    return {
        d["spec"]["template"]["spec"]["containers"][0]["name"]: d
        for d in out.docs
        if d["kind"] == "DaemonSet"
    }


def test_chart_with_mps_renders_the_control_daemon(render: Callable[..., Rendered]) -> None:
    out = render({"config": {"map": {"default": PLAIN_ENTRY, "mps": MPS_ENTRY}, "default": "mps"}})
    sets = daemonsets_by_container(out)
    assert sorted(sets) == ["mps-control-daemon-ctr", CONTAINER]
    plugin, mps = sets[CONTAINER], sets["mps-control-daemon-ctr"]
    check_plugin_daemonset(plugin)
    for doc in out.docs:
        check_schema(doc)
    # the plugin: MPS_ROOT and the root, read-only, at the host path
    ctr = plugin["spec"]["template"]["spec"]["containers"][0]
    assert container_env(ctr)["MPS_ROOT"] == "/run/nvidia/mps"
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "mps-root")
    assert mount == {"name": "mps-root", "mountPath": "/run/nvidia/mps", "readOnly": True}
    volumes = {v["name"]: v for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert volumes["mps-root"]["hostPath"] == {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}
    # the control daemon: NVIDIA's selector (the plugin's), node selector, privileges, mounts
    assert mps["spec"]["selector"]["matchLabels"] == plugin["spec"]["selector"]["matchLabels"]
    pod = mps["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    assert pod["hostPID"] is True
    manager_init, init = pod["initContainers"]  # the config-manager's first: see the test below
    assert manager_init["name"] == "mps-control-daemon-init"
    assert init["command"] == ["nvdp", "mps-control-daemon", "mount-shm"]
    assert init["securityContext"] == {"privileged": True}
    assert init["volumeMounts"][0]["mountPropagation"] == "Bidirectional"
    daemon, sidecar = pod["containers"]
    assert sidecar["name"] == "mps-control-daemon-sidecar"
    assert daemon["command"] == ["mps-control-daemon"]
    assert daemon["securityContext"] == {
        "runAsUser": 0,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
    }
    assert container_env(daemon) == {
        "MPS_ROOT": "/run/nvidia/mps",
        "CONFIG_FILE": "/config/config.yaml",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    assert mounts == {
        "mps-root": "/run/nvidia/mps",
        "mps-shm": "/dev/shm",
        "config": "/config",
        "available-configs": "/available-configs",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["mps-shm"]["hostPath"]["path"] == "/run/nvidia/mps/shm"
    assert volumes["config"] == {"name": "config", "emptyDir": {}}


@pytest.mark.parametrize(
    "config",
    [{"map": {"default": PLAIN_ENTRY, "mps": MPS_ENTRY}, "default": "mps"}, {"name": "site-configs"}],
    ids=["config.map", "config.name"],
)
def test_mps_daemon_follows_the_node_config_label(render: Callable[..., Rendered], config: Doc) -> None:
    """With a ConfigMap of entries, the MPS daemon pod gets the plugin's config-manager pair
    (signalling mps-control-daemon, its console script), so a node reads the entry its label selects
    and a label change reloads the daemon (SIGHUP), as in the plugin and GFD pods."""
    out = render({"config": config})
    for doc in out.docs:
        check_schema(doc)
    sets = daemonsets_by_container(out)
    plugin = sets[CONTAINER]["spec"]["template"]["spec"]
    pod = sets["mps-control-daemon-ctr"]["spec"]["template"]["spec"]
    # the sidecar sees the daemon through the host's PID namespace; Kubernetes refuses
    # shareProcessNamespace together with hostPID
    assert pod["hostPID"] is True and "shareProcessNamespace" not in pod
    manager_init, shm_init = pod["initContainers"]
    daemon, sidecar = pod["containers"]
    plugin_init, plugin_sidecar = plugin["initContainers"][0], plugin["containers"][1]
    process = "mps-control-daemon"
    assert (manager_init["name"], sidecar["name"]) == (f"{process}-init", f"{process}-sidecar")
    assert shm_init["name"] == "mps-shm"
    for container in (manager_init, sidecar):
        assert container_env(container)["PROCESS_TO_SIGNAL"] == process
    assert (container_env(manager_init)["SEND_SIGNAL"], container_env(sidecar)["SEND_SIGNAL"]) == (
        "false",
        "true",
    )
    # the very same containers as the plugin's otherwise: label, source dir, default, fallbacks
    assert without(manager_init, "PROCESS_TO_SIGNAL") == without(plugin_init, "PROCESS_TO_SIGNAL")
    assert without(sidecar, "PROCESS_TO_SIGNAL") == without(plugin_sidecar, "PROCESS_TO_SIGNAL")
    assert daemon["command"] == [process]
    assert container_env(daemon)["CONFIG_FILE"] == "/config/config.yaml"
    volumes = {v["name"]: v for v in pod["volumes"]}
    plugin_volumes = {v["name"]: v for v in plugin["volumes"]}
    for name in ("available-configs", "config"):
        assert volumes[name] == plugin_volumes[name], name
    mounts = {m["name"]: m for m in daemon["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/config", "readOnly": True}


def test_mps_daemon_without_a_config_map_has_no_config_manager(render: Callable[..., Rendered]) -> None:
    pod = daemonsets_by_container(render({"mps": {"enabled": True}}))["mps-control-daemon-ctr"]["spec"][
        "template"
    ]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["mps-shm"]
    assert [c["name"] for c in pod["containers"]] == ["mps-control-daemon-ctr"]
    assert "CONFIG_FILE" not in container_env(pod["containers"][0])


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
        # An external ConfigMap (the GPU operator's way): its entries are unknown when rendering and
        # may change later, so the daemon is there, as in NVIDIA's chart (its pods run only on nodes
        # labelled nvidia.com/mps.capable=true).
        pytest.param({"config": {"name": "site-configs", "default": "default"}}, True, id="config-name"),
        pytest.param(
            {"config": {"name": "site-configs", "default": "default"}, "mps": {"enabled": False}},
            False,
            id="config-name-switched-off",
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
    sets = daemonsets_by_container(out)
    assert ("mps-control-daemon-ctr" in sets) is rendered
    ctr = sets[CONTAINER]["spec"]["template"]["spec"]["containers"][0]
    assert ("MPS_ROOT" in container_env(ctr)) is rendered
    assert any(m["name"] == "mps-root" for m in ctr["volumeMounts"]) is rendered


def test_mps_root_and_security_context_values(render: Callable[..., Rendered]) -> None:
    out = render(
        {
            "config": {"map": {"default": MPS_ENTRY}},
            "mps": {"root": "/var/run/mps", "securityContext": {"privileged": True}},
            "nvidiaDriverRoot": "/run/nvidia/driver",
        }
    )
    daemon = daemonsets_by_container(out)["mps-control-daemon-ctr"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert daemon["securityContext"] == {"privileged": True}
    assert container_env(daemon)["MPS_ROOT"] == "/var/run/mps"
    assert container_env(daemon)["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
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
    chart = daemonsets_by_container(render({"config": {"map": {"default": MPS_ENTRY}}}))[
        "mps-control-daemon-ctr"
    ]
    ours = deploy.only(static, "DaemonSet")["spec"]["template"]["spec"]
    theirs = chart["spec"]["template"]["spec"]
    for key in ("hostPID", "nodeSelector", "priorityClassName"):
        assert ours[key] == theirs[key], key
    for ctr_key in ("initContainers", "containers"):
        # the static manifest has one config file: no config-manager pair, the file mounted directly
        pair = ("mps-control-daemon-init", "mps-control-daemon-sidecar")
        chart_ctrs = [c for c in theirs[ctr_key] if c["name"] not in pair]
        for a, b in zip(ours[ctr_key], chart_ctrs, strict=True):
            assert (a["command"], a["securityContext"]) == (b["command"], b["securityContext"])
            assert container_env(a) == container_env(b)
            assert [(m["mountPath"], m.get("mountPropagation")) for m in a["volumeMounts"]] == [
                (m["mountPath"], m.get("mountPropagation"))
                for m in b["volumeMounts"]
                if m["name"] != "available-configs"
            ]
