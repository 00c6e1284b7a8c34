"""The chart's DRA kubelet plugin (dra.enabled), rendered by the real Helm engine: its DaemonSet (the
command, NVIDIA's env names, every one read by the program, the kubelet's directories and the CDI
root mounted, maxSurge 0), NVIDIA's DeviceClasses, its RBAC (ResourceSlices written, ResourceClaims
only read) and the admission policy that keeps it to its own node's slices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nvdp.dra.options import DRA_OPTIONS
from nvdp.dra_standin.scheduler import nvidia_device_classes
from tests.test_deploy import NAMESPACE, Doc, Rendered, _find_renderer, check_schema, container_env

DRA_ENV = frozenset(
    {env for o in DRA_OPTIONS for env in o.envs} | {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
)
ENABLED = {"dra": {"enabled": True}}


@pytest.fixture(scope="module")
def render() -> Callable[..., Rendered]:
    found, reason = _find_renderer()
    if found is None:
        pytest.skip(reason)
    renderer = found

    def run(values: dict[str, Any] | None = None) -> Rendered:
        return Rendered(renderer(values or {}, NAMESPACE, ()))

    return run


def dra_daemonset(out: Rendered) -> Doc:
    (found,) = [
        d
        for d in out.docs
        if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("dra-kubelet-plugin")
    ]
    return found


def named(out: Rendered, kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in out.docs if d["kind"] == kind}


def test_nothing_of_dra_by_default(render: Callable[..., Rendered]) -> None:
    out = render()
    assert not [d for d in out.docs if "dra" in d["metadata"]["name"] or d["kind"] == "DeviceClass"]


def test_the_kubelet_plugin_daemonset(render: Callable[..., Rendered]) -> None:
    out = render(
        {**ENABLED, "nvidiaDriverRoot": "/run/nvidia/driver", "nvml": "sim:dgx-a100", "logLevel": "debug"}
    )
    daemonset = dra_daemonset(out)
    check_schema(daemonset)
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = daemonset["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["nvdp", "dra-kubelet-plugin"]
    env = container_env(ctr)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert (
        env["CDI_ROOT"],
        env["KUBELET_REGISTRAR_DIRECTORY_PATH"],
        env["KUBELET_PLUGINS_DIRECTORY_PATH"],
    ) == (
        "/var/run/cdi",
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
    )
    assert (env["NVIDIA_DRIVER_ROOT"], env["NVDP_NVML"], env["LOG_LEVEL"]) == (
        "/run/nvidia/driver",
        "sim:dgx-a100",
        "debug",
    )
    assert set(env) <= DRA_ENV, set(env) - DRA_ENV
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    assert mounts == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugins": "/var/lib/kubelet/plugins",
        "cdi-root": "/var/run/cdi",
        "driver-root": "/driver-root",
    }
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes["plugins"] == "/var/lib/kubelet/plugins" and volumes["driver-root"] == "/run/nvidia/driver"
    assert ctr["securityContext"] == {"privileged": True}
    plugin_pod = next(d for d in out.docs if d["kind"] == "DaemonSet" and d is not daemonset)["spec"][
        "template"
    ]["spec"]
    assert (pod["affinity"], pod["tolerations"]) == (plugin_pod["affinity"], plugin_pod["tolerations"])


def test_nvidias_device_classes(render: Callable[..., Rendered]) -> None:
    classes = named(render(ENABLED), "DeviceClass")
    assert {n: {k: c[k] for k in ("apiVersion", "spec")} for n, c in classes.items()} == {
        n: {k: c[k] for k in ("apiVersion", "spec")} for n, c in nvidia_device_classes().items()
    }
    assert named(render({"dra": {"enabled": True, "deviceClasses": False}}), "DeviceClass") == {}


def test_rbac_writes_slices_reads_claims_and_the_policy_keeps_it_to_its_node(
    render: Callable[..., Rendered],
) -> None:
    out = render(ENABLED)
    name = dra_daemonset(out)["spec"]["template"]["spec"]["serviceAccountName"]
    assert name in named(out, "ServiceAccount")
    role = named(out, "ClusterRole")[name]
    check_schema(role)
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): r["verbs"] for r in role["rules"]}
    assert rules[(("resource.k8s.io",), ("resourceslices",))] == [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "delete",
    ]
    assert rules[(("resource.k8s.io",), ("resourceclaims",))] == ["get"]
    binding = named(out, "ClusterRoleBinding")[name]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    policy = named(out, "ValidatingAdmissionPolicy")[f"{name}-resourceslices"]
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{name}"'
    )
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == [
        "CREATE",
        "UPDATE",
        "DELETE",
    ]
    assert [v["expression"] for v in policy["spec"]["validations"]] == [
        'variables.userNodeName != ""',
        "variables.userNodeName == variables.objectNodeName",
    ]
    assert named(out, "ValidatingAdmissionPolicyBinding")[f"{name}-resourceslices"]["spec"] == {
        "policyName": f"{name}-resourceslices",
        "validationActions": ["Deny"],
    }
    without = render({"dra": {"enabled": True, "validatingAdmissionPolicy": False}})
    assert named(without, "ValidatingAdmissionPolicy") == {}
