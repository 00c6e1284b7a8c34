"""The chart and the static manifests let the plugin write the GPU health condition on its Node
(`nodes/status: patch`, always) and, only where a config entry asks for the taint
(health.taintOnFatal) or gpuHealthTaint says so, patch the Node and tolerate that taint; a bad taint
effect is refused in the plugin's words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nvdp.node.health.condition import TAINT_KEY
from tests import test_deploy
from tests.test_chart_support import program_problems
from tests.test_deploy import Doc, Rendered, load_docs, only

# test_deploy's Helm fixtures, shared by name.
renderer, render, render_error = test_deploy.renderer, test_deploy.render, test_deploy.render_error

STATIC = Path(__file__).resolve().parent.parent / "deployments" / "static"
TAINTING = "version: v1\nhealth:\n  taintOnFatal: NoExecute\n"
PLAIN = "version: v1\n"


def node_verbs(role: Doc) -> dict[str, list[str]]:
    """nodes and nodes/status -> the verbs granted on them."""
    found: dict[str, list[str]] = {}
    for rule in role["rules"]:
        if "" in rule["apiGroups"]:
            for resource in rule["resources"]:
                if resource.startswith("nodes"):
                    found[resource] = sorted(set(found.get(resource, [])) | set(rule["verbs"]))
    return found


def tolerates_the_taint(out: Rendered) -> bool:
    tolerations = out.daemonset["spec"]["template"]["spec"].get("tolerations") or []
    return {"key": TAINT_KEY, "operator": "Exists"} in tolerations


def test_the_condition_takes_a_status_patch_and_nothing_more(render: Callable[..., Rendered]) -> None:
    out = render()
    assert node_verbs(out.only("ClusterRole")) == {"nodes": ["get"], "nodes/status": ["patch"]}
    assert not tolerates_the_taint(out)


@pytest.mark.parametrize(
    ("values", "taints"),
    [
        pytest.param({"config": {"map": {"default": TAINTING}}}, True, id="entry-asks"),
        pytest.param({"config": {"map": {"default": PLAIN, "other": TAINTING}}}, True, id="any-entry-asks"),
        pytest.param({"config": {"map": {"default": PLAIN}}}, False, id="no-entry-asks"),
        pytest.param({"gpuHealthTaint": True}, True, id="value-says-yes"),
        pytest.param(
            {"gpuHealthTaint": False, "config": {"map": {"default": TAINTING}}}, False, id="value-says-no"
        ),
    ],
)
def test_the_taint_takes_a_node_patch_and_a_toleration(
    render: Callable[..., Rendered], values: Doc, taints: bool
) -> None:
    out = render(values)
    verbs = node_verbs(out.only("ClusterRole"))
    assert verbs["nodes/status"] == ["patch"]
    config_manager = "config" in values  # it patches its Node's annotation
    assert ("patch" in verbs["nodes"]) is (taints or config_manager)
    assert tolerates_the_taint(out) is taints
    if taints:
        tolerations = out.daemonset["spec"]["template"]["spec"]["tolerations"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_the_taint_alone_grants_the_node_patch(render: Callable[..., Rendered]) -> None:
    assert node_verbs(render({"gpuHealthTaint": True}).only("ClusterRole"))["nodes"] == ["get", "patch"]


def test_a_bad_taint_effect_is_refused_as_the_plugin_refuses_it(render_error: Callable[..., str]) -> None:
    entry = "version: v1\nhealth:\n  taintOnFatal: NoEvict\n"
    said = render_error({"config": {"map": {"default": entry}}})
    refusal = (
        'health.taintOnFatal: invalid value "NoEvict" (accepted: NoSchedule, PreferNoSchedule, NoExecute)'
    )
    assert f"config.map.default: {refusal}" in said
    assert any(p.endswith(refusal) for p in program_problems([], entry))


@pytest.mark.parametrize("manifest", ["nvidia-device-plugin.yml", "nvidia-device-plugin-config-manager.yml"])
def test_static_manifests_grant_the_condition(manifest: str) -> None:
    docs = load_docs((STATIC / manifest).read_text())
    assert node_verbs(only(docs, "ClusterRole"))["nodes/status"] == ["patch"]


def test_values_document_the_taint_switch() -> None:
    values = yaml.safe_load((test_deploy.CHART / "values.yaml").read_text())
    assert values["gpuHealthTaint"] is None
