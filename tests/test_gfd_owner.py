"""The NodeFeature object's owners, against the Kubernetes API stand-in with its garbage collector:
NVIDIA's gfd owns it by its DaemonSet (controller) and its pod, read from the API server by the pod's
name (--pod-name / POD_NAME, the chart's downward API), so it survives a pod's replacement and goes
with the DaemonSet (`helm uninstall`), taking the node's GPU labels along. A pod that cannot be read
costs the owners, never the labels."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from nvdp.kube import new_api_client
from nvdp.side.gfd.output import NodeFeatureOutput
from testkit import REPO
from tests.kube_api_standin import KubeApiStandin
from tests.test_gfd_process import gfd_argv, gfd_env

NS = "gpu-ns"
NODE_FEATURE = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NS}/nodefeatures/nvidia-features-for-node-a"
DAEMONSET = f"/apis/apps/v1/namespaces/{NS}/daemonsets/nvdp-gpu-feature-discovery"
DS_OWNER = {
    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvdp-gpu-feature-discovery", "uid": "ds-uid",
    "controller": True,
}  # fmt: skip


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def add_pod(api: KubeApiStandin, name: str, uid: str, *, by_daemonset: bool = True) -> None:
    owners = [{**DS_OWNER, "blockOwnerDeletion": True}] if by_daemonset else []
    metadata = {"name": name, "namespace": NS, "uid": uid, "ownerReferences": owners}
    api.put(pod_path(name), {"apiVersion": "v1", "kind": "Pod", "metadata": metadata})


def pod_owner(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def label_once(api: KubeApiStandin, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    argv = gfd_argv("--oneshot", "--use-node-feature-api", "--kubeconfig", str(kubeconfig))
    environ = gfd_env(NODE_NAME="node-a", NAMESPACE=NS, **env)
    result = subprocess.run(argv, env=environ, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def owners(api: KubeApiStandin) -> list[dict[str, Any]] | None:
    stored = api.objects.get(NODE_FEATURE)
    assert stored is not None and stored["spec"]["labels"]["nvidia.com/gpu.count"] == "4"
    found: list[dict[str, Any]] | None = stored["metadata"].get("ownerReferences")
    return found


def test_the_node_feature_is_owned_by_the_daemonset_and_the_pod_and_goes_with_the_daemonset(
    tmp_path: Path,
) -> None:
    with KubeApiStandin() as api:
        api.put(DAEMONSET, {"kind": "DaemonSet", "metadata": {"name": DS_OWNER["name"], "uid": "ds-uid"}})
        add_pod(api, "gfd-abc", "pod-1")
        label_once(api, tmp_path, POD_NAME="gfd-abc")
        assert owners(api) == [DS_OWNER, pod_owner("gfd-abc", "pod-1")]
        assert api.count("GET", pod_path("gfd-abc")) == 1

        # The pod is replaced (a rollout, a node reboot): the DaemonSet still owns the labels.
        api.delete(pod_path("gfd-abc"))
        assert api.collect_garbage() == []
        add_pod(api, "gfd-xyz", "pod-2")
        label_once(api, tmp_path, POD_NAME="gfd-xyz")
        assert owners(api) == [DS_OWNER, pod_owner("gfd-xyz", "pod-2")]

        # helm uninstall: the DaemonSet and its pods go, and the NodeFeature with them.
        api.delete(DAEMONSET)
        api.delete(pod_path("gfd-xyz"))
        assert api.collect_garbage() == [NODE_FEATURE]


@pytest.mark.parametrize(
    ("env", "pod", "warned"),
    [
        pytest.param({}, None, False, id="no-pod-name"),
        pytest.param({"POD_NAME": "gfd-abc"}, "not-by-a-daemonset", False, id="no-daemonset"),
        pytest.param({"POD_NAME": "gfd-gone"}, None, True, id="pod-not-found"),
    ],
)
def test_without_a_daemonset_owner_the_labels_are_written_without_owners(
    tmp_path: Path, env: dict[str, str], pod: str | None, warned: bool
) -> None:
    """NVIDIA's choices: no pod name or a pod no DaemonSet owns is no owner (an INFO line for the
    latter); a pod that cannot be read is one WARNING and no owner; the labels are written all the same."""
    with KubeApiStandin() as api:
        if pod is not None:
            add_pod(api, "gfd-abc", "pod-1", by_daemonset=False)
        result = label_once(api, tmp_path, **env)
        assert owners(api) is None
        warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
        if warned:
            assert len(warnings) == 1
            assert "cannot read this pod; the NodeFeature is written without owner references" in warnings[0]
            assert f"pod={NS}/gfd-gone" in warnings[0] and "HTTP 404" in warnings[0]
        else:
            assert warnings == []
        assert "Traceback" not in result.stderr


def test_a_pod_unreadable_for_a_while_owns_the_labels_once_it_is_read() -> None:
    """Where NVIDIA reads the pod once per start, nvdp reads it again at each write until it answers."""
    with KubeApiStandin() as api:
        add_pod(api, "gfd-abc", "pod-1")
        output = NodeFeatureOutput(
            "node-a", NS, api_factory=lambda: new_api_client(host=api.url, retries=0), pod_name="gfd-abc"
        )
        api.fail(500, path_prefix=pod_path("gfd-abc"))
        labels = {"nvidia.com/gpu.count": "4"}
        assert output.write(labels) is True
        assert owners(api) is None and output.owners is None
        assert output.write(labels) is True  # same labels, but now the owners are known
        assert owners(api) == [DS_OWNER, pod_owner("gfd-abc", "pod-1")]
        assert output.write(labels) is False and api.count("GET", pod_path("gfd-abc")) == 2
