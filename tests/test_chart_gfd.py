"""The chart's GPU feature discovery DaemonSet (gfd.enabled) and its static manifest, rendered by the
real Helm engine and checked against the Kubernetes API schemas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nvdp.config import OPTIONS
from nvdp.gfd.options import GFD_OPTIONS
from tests.test_deploy import (
    NAMESPACE,
    ROOT,
    Doc,
    Rendered,
    _find_renderer,
    chart_values,
    check_schema,
    load_docs,
    only,
)

STATIC = ROOT / "deployments" / "static" / "gpu-feature-discovery.yml"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
GFD_CONTAINER = "gpu-feature-discovery-ctr"
# What `nvdp gfd` reads (its own options, the shared plugin ones with GFD_ aliases) and what the
# container toolkit reads.
GFD_ENV = frozenset(
    {o.env for o in GFD_OPTIONS}
    | {env for o in OPTIONS for env in o.envs}
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
    found = [d for name, d in daemonsets(out).items() if not name.endswith("gpu-feature-discovery")]
    assert len(found) == 1
    return found[0]


def gfd_container(daemonset: Doc) -> Doc:
    containers: list[Doc] = daemonset["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [GFD_CONTAINER]
    return containers[0]


def env_of(daemonset: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in gfd_container(daemonset).get("env", [])}


def check_gfd_daemonset(daemonset: Doc, plugin_pod: Doc) -> None:
    spec = daemonset["spec"]
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    ctr = gfd_container(daemonset)
    assert ctr["command"] == ["nvdp", "gfd"]
    assert ctr["image"] == plugin_pod["containers"][0]["image"]
    env = env_of(daemonset)
    assert not set(env) - GFD_ENV, f"env vars nvdp gfd does not read: {sorted(set(env) - GFD_ENV)}"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["KUBERNETES_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for key in ("affinity", "tolerations", "priorityClassName"):
        assert pod.get(key) == plugin_pod.get(key), key
    assert ctr["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_gfd_disabled_by_default(render: Callable[..., Rendered]) -> None:
    out = render()
    assert len(daemonsets(out)) == 1
    assert "Role" not in out.kinds()


def test_gfd_enabled_writes_the_features_file(render: Callable[..., Rendered]) -> None:
    out = render({"gfd": {"enabled": True, "sleepInterval": "30s"}})
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["output-dir"]["hostPath"] == {"path": FEATURES_DIR, "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in gfd_container(daemonset)["volumeMounts"]}
    assert mounts["output-dir"] == FEATURES_DIR
    env = env_of(daemonset)
    assert env["GFD_SLEEP_INTERVAL"] == "30s" and "GFD_USE_NODE_FEATURE_API" not in env
    assert "Role" not in out.kinds() and "RoleBinding" not in out.kinds()
    for doc in out.docs:
        check_schema(doc)


def test_gfd_with_the_node_feature_api_gets_a_role(render: Callable[..., Rendered]) -> None:
    out = render({"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": True}})
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    assert env_of(daemonset)["GFD_USE_NODE_FEATURE_API"] == "true"
    assert "volumes" not in daemonset["spec"]["template"]["spec"], "no features.d with the API"
    role = only(out.docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": ["nfd.k8s-sigs.io"],
            "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update"],
        }
    ]
    binding = only(out.docs, "RoleBinding")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for doc in out.docs:
        check_schema(doc)


def test_gfd_reads_the_plugins_config_entry(render: Callable[..., Rendered]) -> None:
    values = {"gfd": {"enabled": True}, "config": {"map": {"default": CONFIG_ENTRY}}, "migStrategy": "mixed"}
    out = render(values)
    daemonset = gfd_daemonset(out)
    plugin = plugin_daemonset(out)
    env = env_of(daemonset)
    assert env["CONFIG_FILE"] == "/config/config.yaml" and env["MIG_STRATEGY"] == "mixed"
    gfd_volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    plugin_volumes = {v["name"]: v for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert gfd_volumes["config"] == plugin_volumes["config"]
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["checksum/config"]
        == plugin["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    )


def test_static_manifest_is_the_charts_gfd_daemonset(render: Callable[..., Rendered]) -> None:
    static = load_docs(STATIC.read_text())
    assert [d["kind"] for d in static] == ["DaemonSet"]
    for doc in static:
        check_schema(doc)
    rendered = gfd_daemonset(render({"gfd": {"enabled": True}}, namespace="kube-system"))
    pod = rendered["spec"]["template"]["spec"]
    pod.pop("serviceAccountName")
    assert static[0]["spec"]["template"]["spec"] == pod
    assert static[0]["metadata"]["namespace"] == "kube-system"
    values = chart_values()
    assert pod["affinity"] == values["affinity"] and pod["tolerations"] == values["tolerations"]


@pytest.mark.parametrize("rbac", [True, False], ids=["rbac", "no-rbac"])
def test_node_feature_role_follows_rbac_create(render: Callable[..., Rendered], rbac: bool) -> None:
    out = render({"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": True}, "rbac": {"create": rbac}})
    assert ("Role" in out.kinds()) is rbac


def test_gfd_with_everything_on_is_valid(render: Callable[..., Rendered]) -> None:
    values = {
        "gfd": {"enabled": True, "resources": {"limits": {"memory": "128Mi"}}},
        "nfd": {"enableNodeFeatureApi": True},
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "config": {"map": {"default": CONFIG_ENTRY}},
        "nvml": "sim:dgx-a100",
        "logFormat": "json",
    }
    out = render(values)
    daemonset = gfd_daemonset(out)
    check_gfd_daemonset(daemonset, plugin_daemonset(out)["spec"]["template"]["spec"])
    mounts = {m["name"]: m["mountPath"] for m in gfd_container(daemonset)["volumeMounts"]}
    assert mounts == {"driver-root": "/driver-root", "config": "/config"}
    assert env_of(daemonset)["NVDP_NVML"] == "sim:dgx-a100"
    for doc in out.docs:
        check_schema(doc)
