"""The config-manager in the chart and the static manifest: init container + sidecar, shared process
namespace, the ConfigMap as the source dir and an emptyDir as the destination, NODE_NAME from the
downward API, RBAC to list, watch and patch (annotate) nodes, and a Role to get, list and watch the
one ConfigMap it also reads through the API (CONFIGMAP_NAME, NAMESPACE from the downward API):
exactly when a ConfigMap of entries is used."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvdp.side.configmanager.settings import OPTIONS, add_flags, resolve
from tests import test_deploy
from tests.test_deploy import (
    CONTAINER,
    ENTRY_A,
    ENTRY_B,
    Doc,
    Rendered,
    apart_from_uninstall,
    check_plugin_daemonset,
    check_schema,
    container_env,
    load_docs,
    only,
)

# test_deploy's fixtures, used here by name
renderer = test_deploy.renderer
render = test_deploy.render

STATIC = (
    Path(__file__).resolve().parent.parent
    / "deployments"
    / "static"
    / "nvidia-device-plugin-config-manager.yml"
)
# The config-manager's options, and the sidecar's pod name and namespace (nvdp.plugins.uninstall, at stop).
MANAGER_ENV = frozenset(env for option in OPTIONS for env in option.envs) | {"POD_NAME", "POD_NAMESPACE"}
SIDECAR = "nvidia-device-plugin-sidecar"
INIT = "nvidia-device-plugin-init"


def pod(daemonset: Doc) -> Doc:
    spec: Doc = daemonset["spec"]["template"]["spec"]
    return spec


def check_config_manager(docs: list[Doc], configmap: str) -> dict[str, Any]:
    """The layout NVIDIA's chart uses; returns the sidecar's env."""
    for doc in docs:
        check_schema(doc)
    (daemonset,) = [
        d for d in docs if d["kind"] == "DaemonSet" and pod(d)["containers"][0]["name"] == CONTAINER
    ]  # the device plugin's (with config.name, the MPS control daemon's is there too)
    check_plugin_daemonset(daemonset)
    spec = pod(daemonset)
    assert spec["shareProcessNamespace"] is True
    (init,) = spec["initContainers"]
    assert [c["name"] for c in spec["containers"]] == [CONTAINER, SIDECAR]
    sidecar = spec["containers"][1]
    assert init["name"] == INIT
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["available-configs"]["configMap"] == {"name": configmap}
    assert volumes["config"] == {"name": "config", "emptyDir": {}}
    plugin = spec["containers"][0]
    assert container_env(plugin)["CONFIG_FILE"] == "/config/config.yaml"
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["config"] == "/config" and mounts["available-configs"] == "/available-configs"
    namespace = daemonset["metadata"]["namespace"]
    for ctr, oneshot in ((init, "true"), (sidecar, "false")):
        assert ctr["command"] == ["nvdp", "config-manager"]
        e = container_env(ctr)
        assert set(e) <= MANAGER_ENV, sorted(set(e) - MANAGER_ENV)
        assert e["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert e["ONESHOT"] == oneshot and e["SEND_SIGNAL"] == ("false" if oneshot == "true" else "true")
        assert (
            e["CONFIG_FILE_SRCDIR"] == "/available-configs" and e["CONFIG_FILE_DST"] == "/config/config.yaml"
        )
        assert e["PROCESS_TO_SIGNAL"] == "nvidia-device-plugin" and e["SIGNAL"] == "1"
        assert e["CONFIGMAP_NAME"] == configmap
        assert e["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]} == mounts_of_manager()
        assert ctr["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        # The env the manifests set is what the command accepts.
        parser = argparse.ArgumentParser()
        add_flags(parser)
        given = {k: v for k, v in e.items() if isinstance(v, str)} | {
            "NODE_NAME": "n",
            "NAMESPACE": namespace,
        }
        settings = resolve(parser.parse_args([]), given)
        assert (settings.configmap_name, settings.namespace) == (configmap, namespace)
    role = only(docs, "ClusterRole")
    nodes = [r for r in role["rules"] if "nodes" in r["resources"]]
    # patch: the applied entry is recorded in a Node annotation (a restarted pod falls back to it)
    assert [sorted(r["verbs"]) for r in nodes] == [["get", "list", "patch", "watch"]]
    # the one ConfigMap, watched by name (list and watch with the field selector metadata.name)
    configmaps = only(apart_from_uninstall(docs), "Role")
    assert configmaps["metadata"]["namespace"] == namespace
    assert configmaps["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [configmap],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = only(apart_from_uninstall(docs), "RoleBinding")
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": configmaps["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace}
    ]
    return container_env(sidecar)


def mounts_of_manager() -> dict[str, str]:
    return {"available-configs": "/available-configs", "config": "/config"}


@pytest.mark.parametrize(
    ("config", "configmap", "default", "fallbacks"),
    [
        pytest.param(
            {"map": {"default": ENTRY_A, "shared": ENTRY_B}},
            "nvdp-nvidia-device-plugin-configs",
            "",
            "named,single",
            id="map",
        ),
        pytest.param(
            {"map": {"a": ENTRY_A, "b": ENTRY_B}, "default": "b", "fallbackStrategies": ["empty"]},
            "nvdp-nvidia-device-plugin-configs",
            "b",
            "empty",
            id="map-default",
        ),
        pytest.param(
            {"name": "site-configs", "default": "a100"}, "site-configs", "a100", "named,single", id="name"
        ),
    ],
)
def test_chart_runs_the_config_manager_with_a_configmap(
    render: Callable[..., Rendered],
    config: Doc,
    configmap: str,
    default: str,
    fallbacks: str,
) -> None:
    out = render({"config": config})
    sidecar_env = check_config_manager(out.docs, configmap)
    assert sidecar_env["DEFAULT_CONFIG"] == default and sidecar_env["FALLBACK_STRATEGIES"] == fallbacks


def test_chart_without_a_configmap_has_no_config_manager(render: Callable[..., Rendered]) -> None:
    out = render()
    spec = pod(out.daemonset)
    assert "shareProcessNamespace" not in spec and "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == [CONTAINER]
    assert "CONFIG_FILE" not in container_env(spec["containers"][0])
    nodes = [r for r in out.only("ClusterRole")["rules"] if "nodes" in r["resources"]]
    assert [r["verbs"] for r in nodes] == [["get"]]


def test_chart_without_rbac_reads_the_mounted_configmap_only(render: Callable[..., Rendered]) -> None:
    """Without the chart's RBAC there is no permission to watch the ConfigMap: the mount only."""
    out = render({"config": {"map": {"default": ENTRY_A}}, "rbac": {"create": False}})
    spec = pod(out.daemonset)
    for ctr in (spec["initContainers"][0], spec["containers"][1]):
        assert not {"CONFIGMAP_NAME", "NAMESPACE"} & set(container_env(ctr))
    assert "Role" not in out.kinds() and "RoleBinding" not in out.kinds()


def test_chart_config_manager_resources(render: Callable[..., Rendered]) -> None:
    limits = {"limits": {"memory": "80Mi"}}
    out = render({"config": {"map": {"default": ENTRY_A}, "managerResources": limits}})
    spec = pod(out.daemonset)
    assert spec["initContainers"][0]["resources"] == limits == spec["containers"][1]["resources"]


def test_static_manifest_with_config_manager() -> None:
    docs = load_docs(STATIC.read_text())
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    sidecar_env = check_config_manager(docs, "nvidia-device-plugin-configs")
    assert sidecar_env["FALLBACK_STRATEGIES"] == "named,single"
    assert set(only(docs, "ConfigMap")["data"]) == {"default", "shared"}
