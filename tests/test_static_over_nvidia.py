"""nvdp's static manifests applied over NVIDIA's (tests/data/static, NVIDIA's v0.20.0 files).

`kubectl apply -f deployments/static/X` on a cluster that runs NVIDIA's static manifest must replace
NVIDIA's pods, not run beside them: each nvdp DaemonSet with an NVIDIA counterpart has its kind,
namespace (none where NVIDIA's has none: the one kubectl is given), name and selector (immutable),
and schedules on every node NVIDIA's does: no node selector, required node affinity or other node
constraint that NVIDIA's lacks, and at least NVIDIA's tolerations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_deploy import ROOT, Doc, load_docs

NVDP = ROOT / "deployments" / "static"
NVIDIA = ROOT / "tests" / "data" / "static"

# nvdp's manifest -> NVIDIA's manifests of the same DaemonSet (none: NVIDIA ships no static one).
COUNTERPARTS: dict[str, tuple[str, ...]] = {
    "nvidia-device-plugin.yml": (
        "nvidia-device-plugin.yml",
        "nvidia-device-plugin-compat-with-cpumanager.yml",
    ),
    "nvidia-device-plugin-config-manager.yml": (
        "nvidia-device-plugin.yml",
        "nvidia-device-plugin-compat-with-cpumanager.yml",
    ),
    "gpu-feature-discovery.yml": (
        "gpu-feature-discovery-daemonset.yaml",
        "gpu-feature-discovery-daemonset-with-mig-single.yaml",
        "gpu-feature-discovery-daemonset-with-mig-mixed.yaml",
    ),
    "nvidia-device-plugin-mps.yml": (),  # NVIDIA's MPS control daemon comes only with its chart
    "nvidia-device-plugin-own-node-policy.yml": (),  # nvdp's: NVIDIA's static manifests have no RBAC
}
PAIRS = [(ours, theirs) for ours, all_theirs in COUNTERPARTS.items() for theirs in all_theirs]
# Pod fields that keep a pod off nodes (besides nodeSelector and required node affinity).
NODE_CONSTRAINTS = ("nodeName", "runtimeClassName")


def the_daemonset(path: Path) -> Doc:
    found = [doc for doc in load_docs(path.read_text()) if doc.get("kind") == "DaemonSet"]
    assert len(found) == 1, f"{path.name}: expected one DaemonSet"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def required_terms(pod: Doc) -> list[list[Doc]] | None:
    """The required node affinity's terms (any one must match), each a list of expressions (all
    must match); None: no required node affinity."""
    required = (
        pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return None
    return [sorted_exprs(term) for term in required["nodeSelectorTerms"]]


def sorted_exprs(term: Doc) -> list[Doc]:
    def normal(expr: Doc) -> Doc:
        return {**expr, "values": sorted(str(v) for v in expr.get("values", []))}

    exprs = [normal(e) for e in term.get("matchExpressions", [])]
    exprs += [{"field": e} for e in term.get("matchFields", [])]
    return sorted(exprs, key=repr)


def admits_every_node_of(ours: list[list[Doc]] | None, theirs: list[list[Doc]] | None) -> bool:
    """Whether required node affinity `ours` admits every node that `theirs` admits: no affinity at
    all, or each of their terms implied by one of ours (ours asks for a subset of its expressions)."""
    if ours is None:
        return True
    if theirs is None:
        return False
    return all(any(all(e in their_term for e in our_term) for our_term in ours) for their_term in theirs)


def test_every_static_manifest_says_whether_nvidia_has_it() -> None:
    assert sorted(p.name for p in NVDP.iterdir()) == sorted(COUNTERPARTS)
    assert {t for ts in COUNTERPARTS.values() for t in ts} == {p.name for p in NVIDIA.glob("*.y*ml")}


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=[f"{o}-over-{t}" for o, t in PAIRS])
def test_applied_over_nvidias_it_replaces_the_same_daemonset(ours: str, theirs: str) -> None:
    mine, nvidia = the_daemonset(NVDP / ours), the_daemonset(NVIDIA / theirs)
    for key in ("apiVersion", "kind"):
        assert mine[key] == nvidia[key]
    assert mine["metadata"]["name"] == nvidia["metadata"]["name"]
    assert mine["metadata"].get("namespace") == nvidia["metadata"].get("namespace")
    assert mine["spec"]["selector"] == nvidia["spec"]["selector"], "a selector is immutable"
    labels = mine["spec"]["template"]["metadata"]["labels"]
    assert mine["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=[f"{o}-over-{t}" for o, t in PAIRS])
def test_applied_over_nvidias_it_runs_on_every_node_nvidias_runs_on(ours: str, theirs: str) -> None:
    mine, nvidia = pod_spec(the_daemonset(NVDP / ours)), pod_spec(the_daemonset(NVIDIA / theirs))
    selector: dict[str, Any] = mine.get("nodeSelector", {})
    assert selector.items() <= nvidia.get("nodeSelector", {}).items(), "a node selector NVIDIA's lacks"
    assert admits_every_node_of(required_terms(mine), required_terms(nvidia)), (
        f"required node affinity stricter than NVIDIA's: {mine.get('affinity')}"
    )
    assert set(mine.get("affinity", {})) - {"nodeAffinity"} <= set(nvidia.get("affinity", {}))
    for field in NODE_CONSTRAINTS:
        assert mine.get(field) == nvidia.get(field), field
    missing = [t for t in nvidia.get("tolerations", []) if t not in mine.get("tolerations", [])]
    assert not missing, f"NVIDIA's tolerations missing: {missing}"


AFFINITY_CASES = {
    "none-over-none": (None, None, True),
    "none-over-some": (None, [[{"key": "a"}]], True),
    "some-over-none": ([[{"key": "a"}]], None, False),
    "same": ([[{"key": "a"}]], [[{"key": "a"}]], True),
    "more-terms": ([[{"key": "a"}], [{"key": "b"}]], [[{"key": "a"}]], True),
    "fewer-terms": ([[{"key": "a"}]], [[{"key": "a"}], [{"key": "b"}]], False),
    "fewer-expressions": ([[{"key": "a"}]], [[{"key": "a"}, {"key": "b"}]], True),
    "more-expressions": ([[{"key": "a"}, {"key": "b"}]], [[{"key": "a"}]], False),
}


@pytest.mark.parametrize("ours, theirs, admits", list(AFFINITY_CASES.values()), ids=list(AFFINITY_CASES))
def test_admits_every_node_of(
    ours: list[list[Doc]] | None, theirs: list[list[Doc]] | None, admits: bool
) -> None:
    assert admits_every_node_of(ours, theirs) is admits
