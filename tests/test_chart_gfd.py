"""The chart's GPU feature discovery DaemonSet (gfd.enabled) and its static manifest, rendered by the
real Helm engine and checked against the Kubernetes API schemas."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvdp.config import PLUGIN_OPTIONS
from nvdp.side.gfd.options import GFD_OPTIONS
from testkit import clean_env
from tests.test_deploy import (
    CONTAINER,
    NAMESPACE,
    ROOT,
    Doc,
    Rendered,
    _find_renderer,
    apart_from_uninstall,
    chart_values,
    check_schema,
    container_env,
    kinds,
    load_docs,
    only,
    without,
)

STATIC = ROOT / "deployments" / "static" / "gpu-feature-discovery.yml"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
# Node Feature Discovery runs apart: the chart refuses gfd.enabled without nfd.enabled=false.
NFD_APART: dict[str, Any] = {"nfd": {"enabled": False}}
GFD_CONTAINER = "gpu-feature-discovery-ctr"
GFD_PROCESS = "gpu-feature-discovery"  # the console script: the container's command, PROCESS_TO_SIGNAL
# What `nvdp gfd` reads (its own options, the shared plugin ones with GFD_ aliases) and what the
# container toolkit reads.
GFD_ENV = frozenset(
    {env for o in GFD_OPTIONS for env in o.envs}
    | {env for o in PLUGIN_OPTIONS for env in o.envs}
    | {"GFD_MIG_STRATEGY", "GFD_FAIL_ON_INIT_ERROR", "GFD_CONFIG_FILE", "NVIDIA_VISIBLE_DEVICES"}
    | {"NVIDIA_DRIVER_CAPABILITIES"}
)
CONFIG_ENTRY = (ROOT / "tests" / "data" / "gfd" / "configs" / "ts.yaml").read_text()


@pytest.fixture(scope="module")
def render() -> Callable[..., Rendered]:
    """The chart rendered by the real Helm engine (test_deploy's renderer)."""
    found, reason = _find_renderer()
    if found is None:
        pytest.skip(reason)
    renderer = found

    def run(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> Rendered:
        return Rendered(renderer(values or {}, namespace, ()))

    return run


def daemonsets(out: Rendered) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in out.docs if d["kind"] == "DaemonSet"}


def gfd_daemonset(out: Rendered) -> Doc:
    found = [d for name, d in daemonsets(out).items() if name.endswith("gpu-feature-discovery")]
    assert len(found) == 1, sorted(daemonsets(out))
    return found[0]


def plugin_daemonset(out: Rendered) -> Doc:
    """The device plugin's DaemonSet (its first container is the plugin's)."""
    (found,) = [
        d
        for d in daemonsets(out).values()
        if d["spec"]["template"]["spec"]["containers"][0]["name"] == CONTAINER
    ]
    return found


def gfd_container(daemonset: Doc) -> Doc:
    containers: list[Doc] = daemonset["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers][:1] == [GFD_CONTAINER]
    return containers[0]


def env_value(container: Doc, name: str) -> Any:
    return next(e.get("value") for e in container["env"] if e["name"] == name)


def gfd_env_of(daemonset: Doc) -> dict[str, Any]:
    return container_env(gfd_container(daemonset))


def check_gfd_daemonset(daemonset: Doc, plugin_pod: Doc) -> None:
    spec = daemonset["spec"]
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    ctr = gfd_container(daemonset)
    assert ctr["command"] == [GFD_PROCESS]
    assert ctr["image"] == plugin_pod["containers"][0]["image"]
    env = gfd_env_of(daemonset)
    assert not set(env) - GFD_ENV, f"env vars nvdp gfd does not read: {sorted(set(env) - GFD_ENV)}"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["KUBERNETES_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the NodeFeature's owners
    for key in ("affinity", "tolerations", "priorityClassName"):
        assert pod.get(key) == plugin_pod.get(key), key
    assert ctr["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_gfd_disabled_by_default(render: Callable[..., Rendered]) -> None:
    out = render()
    assert len(daemonsets(out)) == 1
    assert "Role" not in kinds(apart_from_uninstall(out.docs))


def test_gfd_enabled_writes_the_features_file(render: Callable[..., Rendered]) -> None:
    out = render({**NFD_APART, "gfd": {"enabled": True, "sleepInterval": "30s"}})
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["output-dir"]["hostPath"] == {"path": FEATURES_DIR, "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in gfd_container(daemonset)["volumeMounts"]}
    assert mounts["output-dir"] == FEATURES_DIR
    env = gfd_env_of(daemonset)
    assert env["GFD_SLEEP_INTERVAL"] == "30s" and env["GFD_USE_NODE_FEATURE_API"] == "false"
    assert not {"Role", "RoleBinding"} & set(kinds(apart_from_uninstall(out.docs)))
    for doc in out.docs:
        check_schema(doc)


def test_gfd_with_the_node_feature_api_gets_a_role(render: Callable[..., Rendered]) -> None:
    out = render({"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": True, "enabled": False}})
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    assert gfd_env_of(daemonset)["GFD_USE_NODE_FEATURE_API"] == "true"
    assert "volumes" not in daemonset["spec"]["template"]["spec"], "no features.d with the API"
    role = only(apart_from_uninstall(out.docs), "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": ["nfd.k8s-sigs.io"],
            "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update", "delete"],  # delete: to set ownerReferences
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},  # the owners: its pod, DaemonSet
    ]
    binding = only(apart_from_uninstall(out.docs), "RoleBinding")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for doc in out.docs:
        check_schema(doc)


@pytest.mark.parametrize(
    "config",
    [{"map": {"default": CONFIG_ENTRY}}, {"name": "site-configs", "default": "ts"}],
    ids=["config.map", "config.name"],
)
def test_gfd_reads_the_plugins_config_entry(render: Callable[..., Rendered], config: Doc) -> None:
    """With a ConfigMap of entries, the GFD pod gets the plugin's config-manager pair (signalling
    gpu-feature-discovery), so both pods link the entry the node label selects."""
    out = render({**NFD_APART, "gfd": {"enabled": True}, "config": config, "migStrategy": "mixed"})
    daemonset = gfd_daemonset(out)
    plugin = plugin_daemonset(out)
    gfd_pod, plugin_pod = daemonset["spec"]["template"]["spec"], plugin["spec"]["template"]["spec"]
    check_gfd_daemonset(daemonset, plugin_pod)
    env = gfd_env_of(daemonset)
    assert env["CONFIG_FILE"] == "/config/config.yaml" and env["MIG_STRATEGY"] == "mixed"
    gfd_volumes = {v["name"]: v for v in gfd_pod["volumes"]}
    plugin_volumes = {v["name"]: v for v in plugin_pod["volumes"]}
    for name in ("available-configs", "config"):
        assert gfd_volumes[name] == plugin_volumes[name], name
    assert gfd_volumes["config"] == {"name": "config", "emptyDir": {}}
    mounts = {m["name"]: m for m in gfd_container(daemonset)["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/config", "readOnly": True}
    assert mounts["available-configs"]["mountPath"] == "/available-configs"
    assert gfd_pod["shareProcessNamespace"] is True
    (gfd_init,) = gfd_pod["initContainers"]
    (plugin_init,) = plugin_pod["initContainers"]
    gfd_sidecar, plugin_sidecar = gfd_pod["containers"][1], plugin_pod["containers"][1]
    assert [gfd_init["name"], gfd_sidecar["name"]] == [f"{GFD_PROCESS}-init", f"{GFD_PROCESS}-sidecar"]
    assert len(gfd_pod["containers"]) == 2
    for container in (gfd_init, gfd_sidecar):
        assert env_value(container, "PROCESS_TO_SIGNAL") == GFD_PROCESS
    assert env_value(plugin_sidecar, "PROCESS_TO_SIGNAL") == "nvidia-device-plugin"
    assert env_value(gfd_sidecar, "SEND_SIGNAL") == "true" and env_value(gfd_init, "SEND_SIGNAL") == "false"
    # Otherwise the very same containers as the plugin's: same label, source dir, default, fallbacks.
    assert without(gfd_init, "PROCESS_TO_SIGNAL") == without(plugin_init, "PROCESS_TO_SIGNAL")
    assert without(gfd_sidecar, "PROCESS_TO_SIGNAL") == without(plugin_sidecar, "PROCESS_TO_SIGNAL")
    annotations = daemonset["spec"]["template"]["metadata"].get("annotations", {})
    plugin_annotations = plugin["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("checksum/config") == plugin_annotations.get("checksum/config")
    assert ("checksum/config" in annotations) is ("map" in config)
    for doc in out.docs:
        check_schema(doc)


def test_gfd_without_a_config_map_has_no_config_manager(render: Callable[..., Rendered]) -> None:
    daemonset = gfd_daemonset(render({**NFD_APART, "gfd": {"enabled": True}}))
    pod = daemonset["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "shareProcessNamespace" not in pod
    assert "CONFIG_FILE" not in gfd_env_of(daemonset)
    assert [c["name"] for c in pod["containers"]] == [GFD_CONTAINER]


def test_static_manifest_is_the_charts_gfd_daemonset(render: Callable[..., Rendered]) -> None:
    static = load_docs(STATIC.read_text())
    assert [d["kind"] for d in static] == ["DaemonSet"]
    for doc in static:
        check_schema(doc)
    values = {
        **NFD_APART,
        "gfd": {"enabled": True},
        "image": {"repository": "nvdp"},
    }  # the static manifests' image
    rendered = gfd_daemonset(render(values, namespace="kube-system"))
    pod = rendered["spec"]["template"]["spec"]
    pod.pop("serviceAccountName")
    assert static[0]["spec"]["template"]["spec"] == pod
    assert "namespace" not in static[0]["metadata"], "NVIDIA's has none: kubectl's namespace"
    values = chart_values()
    assert pod["affinity"] == values["affinity"] and pod["tolerations"] == values["tolerations"]


@pytest.mark.parametrize("rbac", [True, False], ids=["rbac", "no-rbac"])
def test_node_feature_role_follows_rbac_create(render: Callable[..., Rendered], rbac: bool) -> None:
    out = render(
        {
            "gfd": {"enabled": True},
            "nfd": {"enableNodeFeatureApi": True, "enabled": False},
            "rbac": {"create": rbac},
        }
    )
    assert ("Role" in kinds(apart_from_uninstall(out.docs))) is rbac


def test_gfd_with_everything_on_is_valid(render: Callable[..., Rendered]) -> None:
    values = {
        "gfd": {"enabled": True, "resources": {"limits": {"memory": "128Mi"}}},
        "nfd": {"enableNodeFeatureApi": True, "enabled": False},
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "config": {"map": {"default": CONFIG_ENTRY}},
        "nvml": "sim:dgx-a100",
        "logFormat": "json",
    }
    out = render(values)
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    mounts = {m["name"]: m["mountPath"] for m in gfd_container(daemonset)["volumeMounts"]}
    assert mounts == {
        "driver-root": "/driver-root",
        "config": "/config",
        "available-configs": "/available-configs",
    }
    assert gfd_env_of(daemonset)["NVDP_NVML"] == "sim:dgx-a100"
    for doc in out.docs:
        check_schema(doc)


MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


def console_script_argv(name: str) -> list[str]:
    """The argv of one of the image's console scripts (pyproject's [project.scripts]), run from here."""
    module, _, function = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][
        name
    ].partition(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def test_the_gfd_container_labels_an_mps_entry(render: Callable[..., Rendered], tmp_path: Path) -> None:
    """The GFD pod's own command line and env, run against the rendered ConfigMap's MPS entry: it
    labels the node (NVIDIA's gfd does; the chart gives the GFD pod no MPS root, and needs none)."""
    out = render(
        {
            **NFD_APART,
            "gfd": {"enabled": True},
            "config": {"map": {"default": MPS_ENTRY}},
            "nvml": "sim:dgx-a100",
        }
    )
    ctr = gfd_container(gfd_daemonset(out))
    entry = next(d for d in out.docs if d["kind"] == "ConfigMap" and "default" in d.get("data", {}))
    config = tmp_path / "config.yaml"  # what the config-manager's init container links /config/config.yaml to
    config.write_text(entry["data"]["default"])
    env = {k: v for k, v in clean_env().items() if not k.startswith("GFD_") and k not in GFD_ENV}
    from_pod = {"spec.nodeName": "node-a", "metadata.namespace": NAMESPACE, "metadata.name": "gfd-abc"}
    for var in ctr["env"]:
        value = var["value"] if "value" in var else from_pod[var["valueFrom"]["fieldRef"]["fieldPath"]]
        env[var["name"]] = str(config) if value == "/config/config.yaml" else value
    assert "MPS_ROOT" not in env and env["NVDP_NVML"] == "sim:dgx-a100"
    features = tmp_path / "features.d" / "gfd"  # the hostPath mount
    features.parent.mkdir()
    (command,) = ctr["command"]
    argv = [*console_script_argv(command), *ctr.get("args", []), "--oneshot", "--output-file", str(features)]
    result = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    labels = dict(line.split("=", 1) for line in features.read_text().splitlines())
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4" and labels["nvidia.com/mps.capable"] == "true"


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"config": {"map": {"default": CONFIG_ENTRY}}},
        {"config": {"name": "site-configs", "default": "default"}},
    ],
    ids=["no-config", "config-map", "config-name"],
)
def test_gfd_standalone(render: Callable[..., Rendered], config: dict[str, Any]) -> None:
    """NVIDIA's "GFD standalone" (devicePlugin.enabled=false, gfd.enabled=true): the GFD DaemonSet and
    what it needs (service account and RBAC, the ConfigMap and the config-manager's Role), and no
    device plugin, MPS control daemon, Service or monitors."""
    values = {
        **NFD_APART,
        **config,
        "devicePlugin": {"enabled": False},
        "gfd": {"enabled": True},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "forceMonitors": True,
        },
    }
    out = render(values)
    ((name, daemonset),) = daemonsets(out).items()
    assert name == "nvdp-nvidia-device-plugin-gpu-feature-discovery"
    assert GFD_CONTAINER in [c["name"] for c in daemonset["spec"]["template"]["spec"]["containers"]]
    expected = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    if config:
        expected += ["Role", "RoleBinding"] + (["ConfigMap"] if "map" in config["config"] else [])
    assert kinds(apart_from_uninstall(out.docs)) == sorted(expected)
    for doc in out.docs:
        check_schema(doc)
