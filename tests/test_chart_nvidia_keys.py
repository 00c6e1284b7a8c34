"""Every key of NVIDIA's chart values either changes nvdp's chart render or fails it (real Helm engine).

NVIDIA's values.yaml (tests/data/chart/nvidia-v0.20.0-values.yaml, its source named in its header)
is the list of keys an operator may carry over; a key that renders byte-identical to the chart
without it would be silently ignored. Each key is set, one at a time, to a value other than its
default, on top of the values that make it matter (GFD keys with GFD on, MPS keys with MPS on),
and the render must differ or fail with a message naming the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests import test_deploy as deploy
from tests.test_deploy import (
    CONTAINER,
    NAMESPACE,
    ROOT,
    Doc,
    Rendered,
    Renderer,
    RenderError,
    check_plugin_daemonset,
    check_schema,
    container_env,
    env_of,
)

renderer = deploy.renderer  # fixtures shared with the chart's main tests
render, render_error = deploy.render, deploy.render_error

NVIDIA_VALUES = ROOT / "tests" / "data" / "chart" / "nvidia-v0.20.0-values.yaml"
ENTRY = "version: v1\nflags:\n  migStrategy: none\n"
MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"

GFD: Doc = {"gfd": {"enabled": True}, "nfd": {"enabled": False}}
# GFD as NVIDIA's chart deploys it by default: with its Node Feature Discovery subchart.
GFD_WITH_NFD: Doc = {"gfd": {"enabled": True}}
MPS: Doc = {"config": {"map": {"default": MPS_ENTRY}}}
CONFIG: Doc = {"config": {"map": {"default": ENTRY, "other": ENTRY}}}


@dataclass(frozen=True)
class Change:
    """A value other than NVIDIA's default, and the values (and namespace) it is set on top of."""

    value: Any
    context: Doc = field(default_factory=dict)
    namespace: str = NAMESPACE


CHANGES: dict[str, Change] = {
    "config.name": Change("site-configs"),
    "config.map": Change({"only": ENTRY}),
    "config.default": Change("other", CONFIG),
    "config.fallbackStrategies": Change(["named", "single", "empty"], CONFIG),
    "compatWithCPUManager": Change(True),
    "migStrategy": Change("single"),
    "failOnInitError": Change(False),
    "deviceListStrategy": Change("volume-mounts"),
    "deviceIDStrategy": Change("index"),
    "nvidiaDriverRoot": Change("/run/nvidia/driver"),
    "gdrcopyEnabled": Change(True),
    "gdsEnabled": Change(True),
    "mofedEnabled": Change(True),
    "deviceDiscoveryStrategy": Change("nvml"),
    "nameOverride": Change("gpu-plugin"),
    "fullnameOverride": Change("gpu-plugin"),
    "namespaceOverride": Change("gpu-operator"),
    "selectorLabelsOverride": Change({"name": "nvidia-device-plugin-ds"}),
    "componentSelectorLabels.enabled": Change(True, {**GFD, **MPS}),
    "allowDefaultNamespace": Change(True, namespace="default"),
    "imagePullSecrets": Change([{"name": "regcred"}]),
    "image.repository": Change("registry.example/team/nvdp"),
    "image.pullPolicy": Change("Always"),
    "image.tag": Change("dev"),
    "updateStrategy.type": Change("OnDelete"),
    "podAnnotations": Change({"team": "ml"}),
    "podSecurityContext": Change({"runAsNonRoot": False}),
    "securityContext": Change({"privileged": True}),
    "resources": Change({"requests": {"cpu": "50m"}}),
    "nodeSelector": Change({"pool": "gpu"}),
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms": Change(
        [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]
    ),
    "tolerations": Change([]),
    "priorityClassName": Change(""),
    "runtimeClassName": Change("nvidia"),
    "devicePlugin.enabled": Change(False, GFD),
    "devicePlugin.containers.main.env": Change([{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]),
    "gfd.enabled": Change(True),
    "gfd.nameOverride": Change("gfd", GFD),
    "gfd.namespaceOverride": Change("gfd-system", GFD),
    "gfd.noTimestamp": Change(True, GFD),
    "gfd.sleepInterval": Change("30s", GFD),
    "gfd.securityContext.privileged": Change(False, GFD),
    "nfd.nameOverride": Change("nfd", GFD_WITH_NFD),
    "nfd.master.serviceAccount.name": Change("nfd-master", GFD_WITH_NFD),
    "nfd.master.serviceAccount.create": Change(False, GFD_WITH_NFD),
    "nfd.master.config.extraLabelNs": Change(["nvidia.com", "example.com"], GFD_WITH_NFD),
    "nfd.worker.tolerations": Change([], GFD_WITH_NFD),
    "nfd.worker.config.sources.pci.deviceClassWhitelist": Change(["03"], GFD_WITH_NFD),
    "nfd.worker.config.sources.pci.deviceLabelFields": Change(["vendor", "device"], GFD_WITH_NFD),
    "mps.root": Change("/var/run/mps", MPS),
    "mps.enableHostPID": Change(False, MPS),
    "cdi.nvidiaHookPath": Change("/usr/bin/nvidia-cdi-hook"),
    "cdi.featureFlags": Change("feature-a"),
    # Keys NVIDIA's values.yaml shows only as comments ("# enableHostNetwork: false") ...
    "devicePlugin.enableHostNetwork": Change(True),
    "gfd.enableHostNetwork": Change(True, GFD),
    "mps.enableHostNetwork": Change(True, MPS),
    # ... and keys its templates read (templates/daemonset-gfd.yml: GFD_NO_TIMESTAMP,
    # GFD_SLEEP_INTERVAL) that its values.yaml does not list.
    "noTimestamp": Change(True, GFD),
    "sleepInterval": Change("30s", GFD),
}
COMMENTED_KEYS = {"devicePlugin.enableHostNetwork", "gfd.enableHostNetwork", "mps.enableHostNetwork"}
TEMPLATE_ONLY_KEYS = {"noTimestamp", "sleepInterval"}


def nvidia_values() -> Doc:
    values = yaml.safe_load(NVIDIA_VALUES.read_text())
    assert isinstance(values, dict)
    return values


def leaf_keys(values: Mapping[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the values' leaves: scalars, lists and empty mappings."""
    keys = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            keys |= leaf_keys(value, path + ".")
        else:
            keys.add(path)
    return keys


def nested(dotted: str, value: Any) -> Doc:
    for key in reversed(dotted.split(".")):
        value = {key: value}
    assert isinstance(value, dict)
    return value


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> Doc:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def outcome(renderer: Renderer, values: Doc, namespace: str) -> dict[str, str] | str:
    """The rendered manifests, or the render's error."""
    try:
        return renderer(values, namespace, ())
    except RenderError as error:
        return str(error)


def test_every_nvidia_key_is_checked() -> None:
    """The table covers NVIDIA's file exactly (nothing left out, nothing made up)."""
    text = NVIDIA_VALUES.read_text()
    assert "tag v0.20.0" in text.split("\n#\n", 1)[0], "the header names the source"
    assert leaf_keys(nvidia_values()) == set(CHANGES) - COMMENTED_KEYS - TEMPLATE_ONLY_KEYS
    assert len(re.findall(r"^\s+# enableHostNetwork: false$", text, re.MULTILINE)) == len(COMMENTED_KEYS)
    for key, change in CHANGES.items():
        default = _lookup(nvidia_values(), key)
        assert change.value != default, f"{key}: the change is NVIDIA's default"


def _lookup(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_nvidia_key_changes_the_render_or_fails_it(renderer: Renderer, key: str) -> None:
    change = CHANGES[key]
    before = outcome(renderer, change.context, change.namespace)
    after = outcome(renderer, merged(change.context, nested(key, change.value)), change.namespace)
    assert after != before, f"{key}={change.value!r} renders the same as without it"
    if isinstance(after, str):
        assert key in after, f"{key}: the render fails without naming the key: {after}"


def test_nvidia_default_values_render(render: Callable[..., Rendered]) -> None:
    """NVIDIA's whole values file, as an operator copies it, renders valid objects; its container
    env list replaces the chart's NVIDIA_* entries of the same names."""
    values = merged(nvidia_values(), {"image": {"repository": deploy.TEST_IMAGE}})
    for gfd in (False, True):
        out = render(merged(values, {"gfd": {"enabled": gfd}, "nfd": {"enabled": False}}))
        for doc in out.docs:
            check_schema(doc)
        plugin = daemonset(out, CONTAINER)
        check_plugin_daemonset(plugin)
        names = [e["name"] for e in plugin["spec"]["template"]["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names)), f"an env var set twice: {names}"
        assert env_of(plugin)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def daemonset(out: Rendered, container: str) -> Doc:
    """The DaemonSet one of whose containers is `container`."""
    for doc in out.docs:
        if doc["kind"] == "DaemonSet" and container in [c["name"] for c in pod_of(doc)["containers"]]:
            return doc
    raise AssertionError(f"no DaemonSet runs {container}")


def pod_of(doc: Doc) -> Doc:
    pod: Doc = doc["spec"]["template"]["spec"]
    return pod


GFD_CTR, MPS_CTR = "gpu-feature-discovery-ctr", "mps-control-daemon-ctr"


def test_component_selector_labels(render: Callable[..., Rendered]) -> None:
    """NVIDIA's component names (its chart after v0.20.0), in the selectors only when enabled and no
    selectorLabelsOverride is set; the pods always carry them, and the Service and the PodMonitor
    select the device plugin's pods alone by it (without it, the three DaemonSets' pods share NVIDIA's
    selector labels)."""
    out = render({"componentSelectorLabels": {"enabled": True}, **GFD, **MPS})
    expected = {
        CONTAINER: "device-plugin",
        GFD_CTR: "gpu-feature-discovery",
        MPS_CTR: "mps-control-daemon",
    }
    for container, component in expected.items():
        doc = daemonset(out, container)
        selector = doc["spec"]["selector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == component
        assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        check_schema(doc)
    plugin_labels = daemonset(out, CONTAINER)["spec"]["template"]["metadata"]["labels"]
    assert out.only("Service")["spec"]["selector"].items() <= plugin_labels.items()
    override = render(
        {"componentSelectorLabels": {"enabled": True}, "selectorLabelsOverride": {"name": "x"}, **MPS}
    )
    assert daemonset(override, CONTAINER)["spec"]["selector"]["matchLabels"] == {"name": "x"}
    default = render({**GFD, **MPS, "metrics": {"podMonitor": {"enabled": True}, "forceMonitors": True}})
    for container, component in expected.items():
        doc = daemonset(default, container)
        assert "app.kubernetes.io/component" not in doc["spec"]["selector"]["matchLabels"]
        assert doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    for selector in (
        default.only("Service")["spec"]["selector"],
        default.only("PodMonitor")["spec"]["selector"]["matchLabels"],
    ):
        selected = [
            container
            for container in expected
            if selector.items()
            <= daemonset(default, container)["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected == [CONTAINER]


def test_plugin_container_env_list(render: Callable[..., Rendered], render_error: Callable[..., str]) -> None:
    env = [
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        {"name": "HTTPS_PROXY", "value": "p"},
    ]
    out = render({"devicePlugin": {"containers": {"main": {"env": env}}}})
    names = [e["name"] for e in container_env_list(out.daemonset)]
    assert names.count("NVIDIA_DRIVER_CAPABILITIES") == 1 and names[-2:] == [
        "NVIDIA_DRIVER_CAPABILITIES",
        "HTTPS_PROXY",
    ]
    assert env_of(out.daemonset)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    check_schema(out.daemonset)  # (HTTPS_PROXY is no setting of nvdp: check_plugin_daemonset refuses it)
    said = render_error(
        {
            "migStrategy": "single",
            "devicePlugin": {"containers": {"main": {"env": [{"name": "MIG_STRATEGY", "value": "mixed"}]}}},
        }
    )
    assert "devicePlugin.containers.main.env: MIG_STRATEGY is set twice, or also by this chart" in said
    for entry in ({"value": "x"}, "HTTPS_PROXY=p"):
        said = render_error({"devicePlugin": {"containers": {"main": {"env": [entry]}}}})
        shown = json.dumps(entry, separators=(",", ":"))
        assert f"devicePlugin.containers.main.env: an entry without a name: {shown}" in said


def container_env_list(doc: Doc) -> list[Doc]:
    env: list[Doc] = pod_of(doc)["containers"][0]["env"]
    return env


@pytest.mark.parametrize(
    ("flags", "expected"), [("a,b", "a,b"), (["a", "b"], "a,b"), (["a"], "a")], ids=["string", "list", "one"]
)
def test_cdi_feature_flags_string_or_list(render: Callable[..., Rendered], flags: Any, expected: str) -> None:
    assert env_of(render({"cdi": {"featureFlags": flags}}).daemonset)["CDI_FEATURE_FLAGS"] == expected


def test_gfd_keys(render: Callable[..., Rendered], render_error: Callable[..., str]) -> None:
    gfd = {
        "enabled": True,
        "noTimestamp": True,
        "securityContext": {"privileged": True},
        "enableHostNetwork": True,
    }
    doc = daemonset(render({**GFD, "gfd": {**gfd, "nameOverride": "gfd"}, "sleepInterval": "30s"}), GFD_CTR)
    env = container_env(pod_of(doc)["containers"][0])
    assert env["GFD_NO_TIMESTAMP"] == "true" and env["GFD_SLEEP_INTERVAL"] == "30s"
    assert pod_of(doc)["containers"][0]["securityContext"] == {"privileged": True}
    assert pod_of(doc)["hostNetwork"] is True and pod_of(doc)["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert doc["metadata"]["name"] == "nvdp-nvidia-device-plugin-gfd"
    check_schema(doc)
    said = render_error({**GFD, "sleepInterval": "30s", "gfd": {"enabled": True, "sleepInterval": "1m"}})
    assert "sleepInterval: set to 30s, and gfd.sleepInterval to 1m: set one of them" in said
    same = render({**GFD, "noTimestamp": True, "gfd": {"enabled": True, "noTimestamp": True}})
    assert container_env(pod_of(daemonset(same, GFD_CTR))["containers"][0])["GFD_NO_TIMESTAMP"] == "true"
    said = render_error({"gfd": {"enabled": True, "namespaceOverride": "gfd-system"}})
    assert 'gfd.namespaceOverride: "gfd-system" is not supported' in said


@pytest.mark.parametrize("config_manager", [False, True], ids=["no-config-manager", "config-manager"])
def test_mps_host_pid_off(render: Callable[..., Rendered], config_manager: bool) -> None:
    values: Doc = (
        {**MPS, "mps": {"enableHostPID": False}}
        if config_manager
        else {"mps": {"enabled": True, "enableHostPID": False}}
    )
    doc = daemonset(render(values), MPS_CTR)
    pod = pod_of(doc)
    assert pod["hostPID"] is False
    # the config-manager sidecar signals mps-control-daemon in the pod's shared process namespace
    assert pod.get("shareProcessNamespace", False) is config_manager
    assert daemonset(render(MPS), MPS_CTR)["spec"]["template"]["spec"]["hostPID"] is True
    check_schema(doc)


NFD_REFUSED = (
    ": NVIDIA's chart installs Node Feature Discovery with these values (nfd.enabled, else gfd.enabled) "
    "and this chart does not: run NFD with its own chart (or keep the one a release of NVIDIA's chart "
    "installed: see docs/chart.md), put nfd.* settings there, and set nfd.enabled=false"
)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"gfd": {"enabled": True}}, "gfd.enabled"),
        ({"gfd": {"enabled": True}, "nfd": nvidia_values()["nfd"]}, "gfd.enabled"),
        ({"nfd": {"enabled": True}}, "nfd.enabled"),
        ({"gfd": {"enabled": False}, "nfd": {"enabled": True}}, "nfd.enabled"),
        (
            {
                "gfd": {"enabled": True},
                "nfd": {"worker": {"config": {"sources": {"pci": {"deviceLabelFields": []}}}}},
            },
            "nfd.worker.config.sources.pci.deviceLabelFields",
        ),
    ],
    ids=["gfd", "gfd-nvidia-nfd-values", "nfd", "nfd-without-gfd", "gfd-nfd-setting"],
)
def test_refused_where_nvidia_installs_nfd(render_error: Callable[..., str], values: Doc, key: str) -> None:
    """NVIDIA's chart installs its NFD subchart under the condition "nfd.enabled,gfd.enabled"; this chart
    has none, so those values fail in one line naming the key (a `helm upgrade` of NVIDIA's release
    would otherwise delete its NFD)."""
    said = render_error(values)
    assert f"{key}{NFD_REFUSED}" in said
    assert said.count("\n") <= 1, said


@pytest.mark.parametrize(
    "values",
    [
        {"gfd": {"enabled": True}, "nfd": {"enabled": False}},
        {
            "gfd": {"enabled": True},
            "nfd": {"enabled": False, "nameOverride": "x", "worker": {"tolerations": []}},
        },
        {"nfd": {"nameOverride": "x"}},
    ],
    ids=["gfd-nfd-apart", "nfd-settings-unread-when-apart", "no-gfd"],
)
def test_accepted_where_nvidia_installs_no_nfd(render: Callable[..., Rendered], values: Doc) -> None:
    assert render(values).docs


def test_nvidia_values_as_they_are_fail_on_the_image(render_error: Callable[..., str]) -> None:
    """`helm upgrade` of a release of NVIDIA's chart (or -f with NVIDIA's values file) carries NVIDIA's
    image: refused in one line naming image.repository, before anything is changed."""
    said = render_error(nvidia_values())
    assert 'image.repository: "nvcr.io/nvidia/k8s-device-plugin" is NVIDIA\'s image' in said
