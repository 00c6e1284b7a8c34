"""What a release of NVIDIA's chart holds (tests/data/chart/nvidia-v0.20.0-release.yaml), for the upgrade
test: the fields an update may not change, and the writer of that test data.

The writer is run by hand, not by the tests (it needs a copy of NVIDIA's repository):
    python -m tests.nvidia_chart_release NVIDIA_REPO_DIR
NVIDIA_REPO_DIR is a bare or full clone of NVIDIA/k8s-device-plugin. The chart at tag v0.20.0
(deployments/helm/nvidia-device-plugin, with its vendored node-feature-discovery subchart) is rendered
with Helm (helm_python) for each scenario below, over NVIDIA's values.yaml, and every object is kept as
its kind, namespace, name and the fields the API server does not let an update change.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.test_chart_nvidia_keys import merged

TAG = "v0.20.0"
CHART_PATH = "deployments/helm/nvidia-device-plugin"
RELEASE, NAMESPACE = "nvdp", "gpu-system"
OUTPUT = Path(__file__).resolve().parent / "data" / "chart" / "nvidia-v0.20.0-release.yaml"
MPS_ENTRY = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"

# name -> values set over NVIDIA's values.yaml (tests/test_chart_upgrade.py renders nvdp's chart with them).
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gfd": {"gfd": {"enabled": True}},
    "mps-config-map": {"config": {"map": {"default": MPS_ENTRY}}},
    "config-name": {"config": {"name": "site-configs", "default": "default"}},
    "gfd-standalone": {"devicePlugin": {"enabled": False}, "gfd": {"enabled": True}},
}


def immutable_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of `doc` an update may not change (the API server answers `field is immutable`)."""
    kind, spec = doc["kind"], doc.get("spec") or {}
    if kind in ("DaemonSet", "Deployment", "StatefulSet", "ReplicaSet"):
        return {"spec.selector": spec.get("selector")}
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        return {"roleRef": doc.get("roleRef")}
    if kind == "Service" and "clusterIP" in spec:
        return {"spec.clusterIP": spec["clusterIP"]}
    if kind == "Job":
        return {"spec.template": spec.get("template")}
    return {}


def write_release_data(repo: str) -> None:
    import helm_python  # type: ignore[import-not-found]

    archive = subprocess.run(["git", "-C", repo, "archive", TAG, CHART_PATH], capture_output=True, check=True)
    commit = subprocess.run(
        ["git", "-C", repo, "rev-parse", f"{TAG}^{{commit}}"], capture_output=True, check=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(tmp, filter="data")
        chart_dir = Path(tmp) / CHART_PATH
        values = yaml.safe_load((chart_dir / "values.yaml").read_text())
        scenarios = {}
        for name, extra in SCENARIOS.items():
            # A chart loaded once per render: rendering drops the subcharts its conditions turn off.
            with helm_python.Chart.load(str(chart_dir)) as chart:
                rendered = chart.render(
                    merged(values, extra), name=RELEASE, namespace=NAMESPACE, is_install=True
                )
                objects = []
                for source, text in sorted(rendered.items()):
                    for doc in yaml.safe_load_all(text):
                        if not doc or source.endswith("NOTES.txt"):
                            continue
                        if "helm.sh/hook" in (doc["metadata"].get("annotations") or {}):
                            continue  # hooks are not objects of the release
                        objects.append(
                            {
                                "kind": doc["kind"],
                                "namespace": doc["metadata"].get("namespace"),
                                "name": doc["metadata"]["name"],
                                "source": source,
                                "immutable": immutable_fields(doc),
                            }
                        )
                scenarios[name] = {"values": extra, "objects": objects}
    header = "".join(
        f"# {line}\n"
        for line in (
            "The objects of a release of NVIDIA's device plugin chart: kind, namespace, name, the template",
            "(or subchart) that makes it, and the fields an update may not change. Test data for",
            "tests/test_chart_upgrade.py, written by tests/nvidia_chart_release.py.",
            f"Source: repository NVIDIA/k8s-device-plugin, tag {TAG} (commit {commit}),",
            f"chart {CHART_PATH} with its node-feature-discovery 0.19.0 subchart,",
            f"rendered by Helm over the chart's values.yaml for release {RELEASE!r}",
            f"in namespace {NAMESPACE!r}, once per scenario (the values set over it).",
            "Licensed under the Apache License, Version 2.0 (NVIDIA CORPORATION;",
            "NFD: The Kubernetes Authors).",
        )
    )
    body = yaml.safe_dump(
        {"release": RELEASE, "namespace": NAMESPACE, "scenarios": scenarios}, sort_keys=False
    )
    OUTPUT.write_text(header + body)


if __name__ == "__main__":
    write_release_data(sys.argv[1])
