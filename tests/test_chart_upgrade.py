"""`helm upgrade` of a release of NVIDIA's chart (same release name, NVIDIA's values) to nvdp's chart.

The API server refuses an update that changes an immutable field (a DaemonSet's spec.selector, a
binding's roleRef, a Service's clusterIP, ...) with `field is immutable`, and Helm then leaves the
release half-migrated. tests/data/chart/nvidia-v0.20.0-release.yaml holds the objects NVIDIA's chart
v0.20.0 renders for a few scenarios, with those fields (tests/nvidia_chart_release.py wrote it from
NVIDIA's repository); nvdp's chart is rendered by the real Helm engine with NVIDIA's values.yaml and
the same scenario, and every object both hold (same kind, namespace and name: Helm updates it in
place) must keep its immutable fields. Objects only NVIDIA's release holds are deleted by the upgrade,
objects only nvdp's holds are created: neither is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests import test_deploy as deploy
from tests.nvidia_chart_release import OUTPUT as NVIDIA_RELEASE
from tests.nvidia_chart_release import immutable_fields
from tests.test_chart_nvidia_keys import merged, nvidia_values
from tests.test_deploy import TEST_IMAGE, Doc, Rendered

renderer = deploy.renderer  # fixtures shared with the chart's main tests
render, render_error = deploy.render, deploy.render_error

Key = tuple[str, str | None, str]  # kind, namespace, name

# The DaemonSets nvdp's chart renders in each scenario. NVIDIA's chart also renders its MPS control
# daemon without any ConfigMap ("defaults", "gfd"), where no config entry can ask for MPS: nvdp's
# renders none there (the upgrade deletes NVIDIA's, whose pods ran only on nodes labelled
# nvidia.com/mps.capable=true). NVIDIA's "gfd" release also holds Node Feature Discovery (its
# subchart), which nvdp's chart does not install (see test_chart_nvidia_keys: refused unless
# nfd.enabled=false).
PLUGIN = "nvdp-nvidia-device-plugin"
GFD = f"{PLUGIN}-gpu-feature-discovery"
MPS = f"{PLUGIN}-mps-control-daemon"
DAEMONSETS = {
    "defaults": {PLUGIN},
    "gfd": {PLUGIN, GFD},
    "mps-config-map": {PLUGIN, MPS},
    "config-name": {PLUGIN, MPS},
    "gfd-standalone": {GFD},
}


def nvidia_release() -> dict[str, Any]:
    data = yaml.safe_load(NVIDIA_RELEASE.read_text())
    assert isinstance(data, dict)
    return data


def scenarios() -> dict[str, Doc]:
    found: dict[str, Doc] = nvidia_release()["scenarios"]
    return found


def key_of(doc: Doc) -> Key:
    return doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


def immutable_field_changes(nvidia: list[Doc], nvdp: list[Doc]) -> list[str]:
    """What the API server would refuse, one line per field, when `nvdp`'s objects replace `nvidia`'s
    (each given as kind, namespace, name and its immutable fields)."""
    ours = {key_of(doc): immutable_fields(doc) for doc in nvdp}
    said = []
    for obj in nvidia:
        key = (obj["kind"], obj["namespace"], obj["name"])
        if key not in ours:
            continue  # deleted by the upgrade
        for path, value in obj["immutable"].items():
            if ours[key].get(path) != value:
                said.append(f"{key[0]} {key[1]}/{key[2]}: {path}: field is immutable")
    return said


def nvdp_values(scenario: Doc) -> Doc:
    """NVIDIA's values.yaml with the scenario's values, as `helm upgrade -f` gives them, and what nvdp's
    chart asks of an upgrade: an nvdp image, and NFD kept apart where NVIDIA's chart installs it."""
    values = merged(nvidia_values(), scenario["values"])
    values = merged(values, {"image": {"repository": TEST_IMAGE}})
    if values["gfd"]["enabled"]:
        values = merged(values, {"nfd": {"enabled": False}})
    return values


def test_the_test_data_names_its_source() -> None:
    header = NVIDIA_RELEASE.read_text().split("\nrelease:", 1)[0]
    assert "repository NVIDIA/k8s-device-plugin, tag v0.20.0" in header
    release = nvidia_release()
    assert (release["release"], release["namespace"]) == (deploy.RELEASE, deploy.NAMESPACE)
    assert set(scenarios()) == set(DAEMONSETS)


@pytest.mark.parametrize("scenario", sorted(DAEMONSETS))
def test_upgrade_of_nvidia_release_keeps_immutable_fields(
    render: Callable[..., Rendered], scenario: str
) -> None:
    nvidia = scenarios()[scenario]["objects"]
    out = render(nvdp_values(scenarios()[scenario]))
    assert immutable_field_changes(nvidia, out.docs) == []
    # Not vacuous: NVIDIA's DaemonSets that nvdp's chart keeps are the same objects (names), so their
    # selectors were compared above.
    ours = {doc["metadata"]["name"] for doc in out.docs if doc["kind"] == "DaemonSet"}
    theirs = {obj["name"] for obj in nvidia if obj["kind"] == "DaemonSet"}
    assert ours == DAEMONSETS[scenario]
    assert ours <= theirs
    selectors = {o["name"]: o["immutable"]["spec.selector"] for o in nvidia if o["kind"] == "DaemonSet"}
    for doc in out.docs:
        if doc["kind"] == "DaemonSet":
            assert doc["spec"]["selector"] == selectors[doc["metadata"]["name"]]


def test_refusals_are_found(render: Callable[..., Rendered]) -> None:
    """The check sees what the API server refuses: a DaemonSet selector other than NVIDIA's (as nvdp's
    GFD DaemonSet had before: app.kubernetes.io/name: gpu-feature-discovery) and a changed roleRef."""
    nvidia = scenarios()["gfd"]["objects"]
    docs = copy.deepcopy(render(nvdp_values(scenarios()["gfd"])).docs)
    for doc in docs:
        if doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == GFD:
            doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "gpu-feature-discovery"
    binding = next(o for o in nvidia if o["name"] == f"{PLUGIN}-role-binding")
    docs.append(
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding["name"]},
            "roleRef": {**binding["immutable"]["roleRef"], "name": "another-role"},
        }
    )
    assert sorted(immutable_field_changes(nvidia, docs)) == [
        f"ClusterRoleBinding None/{binding['name']}: roleRef: field is immutable",
        f"DaemonSet gpu-system/{GFD}: spec.selector: field is immutable",
    ]
