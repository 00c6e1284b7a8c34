"""What the chart's and the static manifests' service accounts may do, rendered by the real Helm engine:
each ClusterRole grants exactly the requests nvdp issues (nvdp/kube/), and the ValidatingAdmissionPolicy
own-node-policy.yml fences the Node writes to the pod's own Node and to what nvdp writes there. The
policy's CEL is evaluated with Google's CEL runtime (cel-expr-python, optional types on) over untyped
JSON objects: the logic is checked, not the API server's schema typing of `object`."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from nvdp.kube import KubeNodeStatus, new_api_client
from nvdp.node.health.condition import (
    CONDITION_TYPE,
    FATAL_XID,
    HEALTHY,
    TAINT_KEY,
    GpuHealthCondition,
    condition_body,
    taints_with,
)
from nvdp.side.configmanager.command import NodeAnnotationRecord
from nvdp.side.configmanager.settings import APPLIED_ANNOTATION
from tests import test_deploy as deploy
from tests.kube_api_standin import KubeApiStandin
from tests.test_chart_dra import named
from tests.test_deploy import NAMESPACE, RELEASE, Doc, Rendered, check_schema, load_docs

# the Helm fixtures shared with the chart's tests
renderer, render, render_error = deploy.renderer, deploy.render, deploy.render_error

STATIC = Path(__file__).resolve().parent.parent / "deployments" / "static"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
POLICY = f"{RELEASE}-nvidia-device-plugin-own-node"
PLUGIN_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-nvidia-device-plugin-service-account"
DRA_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-nvidia-device-plugin-dra-kubelet-plugin"
CONFIG_MAP = {"config": {"map": {"default": "version: v1\n"}}}

Rules = set[tuple[str, str, tuple[str, ...]]]

# What each process asks of the API server, and where:
# - nodes get: the health condition and taint read the Node (node_status.KubeNodeStatus.read); the DRA
#   plugin reads its UID (nodes.node_uid, its ResourceSlices' owner); the config-manager its labels
#   (nodes.node_metadata).
# - nodes list, watch: the config-manager follows its Node (configmanager/object_watch.NodeWatch).
# - nodes patch: the config-manager's applied annotation (nodes.patch_node_annotations); the health
#   taint (node_status.KubeNodeStatus.replace_taints).
# - nodes/status patch: the condition nvidia.com/GpuHealthy (node_status.KubeNodeStatus.patch_condition).
# - events create: Node and pod Events, core/v1, POSTed once each (events.py, pod_events.py).
# - resourceslices list, watch, create (and dry run), update (PUT), delete: resourceslices.py; no GET.
# - resourceclaims get: resourceclaims.py.
EVENTS = ("", "events", ("create",))
NODE_STATUS = ("", "nodes/status", ("patch",))
SLICES = ("resource.k8s.io", "resourceslices", ("list", "watch", "create", "update", "delete"))
CLAIMS = ("resource.k8s.io", "resourceclaims", ("get",))


def rules(role: Doc) -> Rules:
    return {
        (group, resource, tuple(r["verbs"]))
        for r in role["rules"]
        for group in r["apiGroups"]
        for resource in r["resources"]
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {},
            {"nvdp-nvidia-device-plugin": {("", "nodes", ("get",)), NODE_STATUS, EVENTS}},
            id="defaults",
        ),
        pytest.param(
            {"gpuHealthTaint": True},
            {"nvdp-nvidia-device-plugin": {("", "nodes", ("get", "patch")), NODE_STATUS, EVENTS}},
            id="health-taint",
        ),
        pytest.param(
            CONFIG_MAP,
            {
                "nvdp-nvidia-device-plugin": {
                    ("", "nodes", ("get", "list", "watch", "patch")),
                    NODE_STATUS,
                    EVENTS,
                }
            },
            id="config-manager",
        ),
        pytest.param(
            {"dra": {"enabled": True}},
            {
                "nvdp-nvidia-device-plugin": {("", "nodes", ("get",)), NODE_STATUS, EVENTS},
                "nvdp-nvidia-device-plugin-dra-kubelet-plugin": {
                    SLICES,
                    CLAIMS,
                    ("", "nodes", ("get",)),
                    EVENTS,
                },
            },
            id="dra",
        ),
        pytest.param(
            {"dra": {"enabled": True}, **CONFIG_MAP},
            {
                "nvdp-nvidia-device-plugin": {
                    ("", "nodes", ("get", "list", "watch", "patch")),
                    NODE_STATUS,
                    EVENTS,
                },
                "nvdp-nvidia-device-plugin-dra-kubelet-plugin": {
                    SLICES,
                    CLAIMS,
                    ("", "nodes", ("get", "list", "watch", "patch")),
                    EVENTS,
                },
            },
            id="dra-config-manager",
        ),
    ],
)
def test_cluster_roles_grant_exactly_what_the_code_requests(
    render: Callable[..., Rendered], values: Doc, expected: dict[str, Rules]
) -> None:
    roles = named(render(values), "ClusterRole")
    assert {name: rules(role) for name, role in roles.items()} == expected


@pytest.mark.parametrize(
    ("manifest", "nodes_verbs"),
    [
        pytest.param("nvidia-device-plugin.yml", ("get",), id="plugin"),
        pytest.param(
            "nvidia-device-plugin-config-manager.yml", ("get", "list", "watch", "patch"), id="config"
        ),
    ],
)
def test_static_cluster_roles_grant_exactly_what_the_code_requests(
    manifest: str, nodes_verbs: tuple[str, ...]
) -> None:
    (role,) = [d for d in load_docs((STATIC / manifest).read_text()) if d["kind"] == "ClusterRole"]
    assert rules(role) == {("", "nodes", nodes_verbs), NODE_STATUS, EVENTS}


def test_static_policy_is_the_charts_for_the_static_service_account(render: Callable[..., Rendered]) -> None:
    """deployments/static/nvidia-device-plugin-own-node-policy.yml: the chart's policy for the service
    account of the static manifests (kube-system/nvidia-device-plugin), under the static names."""
    out = render(
        {"rbac": {"ownNodePolicy": True}, "serviceAccount": {"name": "nvidia-device-plugin"}},
        namespace="kube-system",
    )
    chart = [d for d in out.docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    static = load_docs((STATIC / "nvidia-device-plugin-own-node-policy.yml").read_text())
    assert [d["kind"] for d in static] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for mine, theirs in zip(static, chart, strict=True):
        check_schema(mine)
        assert mine["metadata"] == {"name": "nvidia-device-plugin-own-node"}
        spec = theirs["spec"] | (
            {"policyName": "nvidia-device-plugin-own-node"} if "policyName" in theirs["spec"] else {}
        )
        assert mine["spec"] == spec
    for manifest in (
        "nvidia-device-plugin.yml",
        "nvidia-device-plugin-config-manager.yml",
        "nvidia-device-plugin-mps.yml",
    ):
        pods = [d for d in load_docs((STATIC / manifest).read_text()) if d["kind"] == "DaemonSet"]
        assert [p["spec"]["template"]["spec"]["serviceAccountName"] for p in pods] == ["nvidia-device-plugin"]


# ---- the policy: when it is rendered -------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "api_versions", "rendered"),
    [
        pytest.param({}, (), False, id="no-api-served"),
        pytest.param({}, (VAP_API,), True, id="api-served"),
        pytest.param({"rbac": {"ownNodePolicy": True}}, (), True, id="forced"),
        pytest.param({"rbac": {"ownNodePolicy": False}}, (VAP_API,), False, id="off"),
        pytest.param({"rbac": {"create": False, "ownNodePolicy": True}}, (), False, id="no-rbac"),
    ],
)
def test_policy_rendered_where_the_cluster_serves_it(
    render: Callable[..., Rendered], values: Doc, api_versions: tuple[str, ...], rendered: bool
) -> None:
    out = render(values, api_versions=api_versions)
    assert set(named(out, "ValidatingAdmissionPolicy")) == ({POLICY} if rendered else set())
    assert set(named(out, "ValidatingAdmissionPolicyBinding")) == ({POLICY} if rendered else set())


@pytest.mark.parametrize("value", ["yes", 1, {"enabled": True}], ids=["string", "number", "map"])
def test_policy_switch_refuses_what_is_no_boolean(render_error: Callable[..., str], value: object) -> None:
    said = render_error({"rbac": {"ownNodePolicy": value}})
    given = json.dumps(value, separators=(",", ":"))
    assert f"rbac.ownNodePolicy: invalid value {given} (accepted: null, true, false)" in said


@pytest.mark.parametrize(
    ("values", "accounts"),
    [
        pytest.param({}, [PLUGIN_ACCOUNT], id="plugin"),
        pytest.param({"dra": {"enabled": True}}, [PLUGIN_ACCOUNT, DRA_ACCOUNT], id="dra"),
    ],
)
def test_policy_matches_node_updates_by_the_charts_accounts(
    render: Callable[..., Rendered], values: Doc, accounts: list[str]
) -> None:
    out = render({"rbac": {"ownNodePolicy": True}, **values})
    policy = named(out, "ValidatingAdmissionPolicy")[POLICY]
    for doc in (policy, named(out, "ValidatingAdmissionPolicyBinding")[POLICY]):
        check_schema(doc)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # A patch is an UPDATE to admission; RBAC grants no create or delete of nodes.
    assert spec["matchConstraints"] == {
        "resourceRules": [
            {
                "apiGroups": [""],
                "apiVersions": ["*"],
                "operations": ["UPDATE"],
                "resources": ["nodes", "nodes/status"],
            }
        ]
    }
    assert (
        evaluate(spec["matchConditions"][0]["expression"], {"request": {"userInfo": {"username": "x"}}})
        is False
    )
    for account in accounts:
        assert evaluate(
            spec["matchConditions"][0]["expression"], {"request": {"userInfo": {"username": account}}}
        )
    assert named(out, "ValidatingAdmissionPolicyBinding")[POLICY]["spec"] == {
        "policyName": POLICY,
        "validationActions": ["Deny"],
    }


# ---- the policy: its CEL evaluated ---------------------------------------------------------------

OWN, OTHER = "gpu-node-1", "gpu-node-2"
NOW = "2026-01-01T00:00:00Z"


def gpu_node(name: str = OWN) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/device-plugin.config": "a100"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.0.1.0/24",
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "63"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": CONDITION_TYPE, "status": "True", "reason": "GpusHealthy"},
            ],
        },
    }


def changed(edit: Callable[[Doc], object], name: str = OWN) -> Doc:
    new = gpu_node(name)
    edit(new)
    return new


def set_condition(status: str, kind: str = CONDITION_TYPE) -> Callable[[Doc], object]:
    def edit(n: Doc) -> None:
        for c in n["status"]["conditions"]:
            if c["type"] == kind:
                c["status"] = status

    return edit


def add_taint(key: str) -> Callable[[Doc], object]:
    return lambda n: n["spec"]["taints"].append({"key": key, "value": "xid-79", "effect": "NoSchedule"})


def annotate(key: str) -> Callable[[Doc], object]:
    return lambda n: n["metadata"]["annotations"].update({key: "a100"})


@pytest.mark.parametrize(
    ("account", "token_node", "subresource", "new", "denial"),
    [
        pytest.param(
            PLUGIN_ACCOUNT, OWN, "status", changed(set_condition("False")), None, id="own-condition"
        ),
        pytest.param(PLUGIN_ACCOUNT, OWN, "", changed(add_taint(TAINT_KEY)), None, id="own-taint"),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "",
            changed(lambda n: n["spec"]["taints"].clear()),
            "taint",
            id="remove-taint",
        ),
        pytest.param(PLUGIN_ACCOUNT, OWN, "", changed(add_taint("other")), "taint", id="other-taint"),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "",
            changed(lambda n: n["spec"].update({"unschedulable": True})),
            "taint",
            id="cordon",
        ),
        pytest.param(
            PLUGIN_ACCOUNT, OWN, "", changed(annotate(APPLIED_ANNOTATION)), None, id="own-annotation"
        ),
        pytest.param(DRA_ACCOUNT, OWN, "", changed(annotate(APPLIED_ANNOTATION)), None, id="dra-annotation"),
        pytest.param(
            PLUGIN_ACCOUNT, OWN, "", changed(annotate("other")), "annotation", id="other-annotation"
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "",
            changed(lambda n: n["metadata"]["annotations"].clear()),
            "annotation",
            id="remove-annotation",
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "",
            changed(lambda n: n["metadata"]["labels"].update({"node-role.kubernetes.io/control-plane": ""})),
            "labels",
            id="label",
        ),
        pytest.param(
            PLUGIN_ACCOUNT, OWN, "status", changed(set_condition("False", "Ready")), "status", id="own-ready"
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "status",
            changed(lambda n: n["status"]["capacity"].update({"nvidia.com/gpu": "1000"})),
            "status",
            id="own-capacity",
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "status",
            changed(lambda n: n["status"]["addresses"][0].update({"address": "10.9.9.9"})),
            "status",
            id="own-address",
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            OWN,
            "status",
            changed(set_condition("False"), OTHER),
            f"'{PLUGIN_ACCOUNT}' on node '{OWN}' may not modify node '{OTHER}'",
            id="other-node",
        ),
        pytest.param(
            DRA_ACCOUNT,
            OWN,
            "",
            changed(annotate(APPLIED_ANNOTATION), OTHER),
            "may not modify",
            id="dra-other-node",
        ),
        pytest.param(
            PLUGIN_ACCOUNT,
            "",
            "status",
            changed(set_condition("False")),
            "no node association",
            id="no-node-name",
        ),
        pytest.param(
            "system:node:gpu-node-1",
            OWN,
            "status",
            changed(set_condition("False", "Ready")),
            None,
            id="kubelet",
        ),
    ],
)
def test_policy_admits_what_nvdp_writes_on_its_own_node_only(
    render: Callable[..., Rendered],
    account: str,
    token_node: str,
    subresource: str,
    new: Doc,
    denial: str | None,
) -> None:
    spec = named(
        render({"rbac": {"ownNodePolicy": True}, "dra": {"enabled": True}}), "ValidatingAdmissionPolicy"
    )[POLICY]["spec"]
    extra = {"authentication.kubernetes.io/node-name": [token_node]} if token_node else {}
    request = {
        "operation": "UPDATE",
        "subResource": subresource,
        "userInfo": {"username": account, "extra": extra},
    }
    old = gpu_node(new["metadata"]["name"])
    said = admission(spec, {"request": request, "object": new, "oldObject": old})
    assert said is None if denial is None else denial in (said or ""), said


@pytest.mark.parametrize(
    ("subresource", "withdrawn"),
    [
        pytest.param(
            "status",
            lambda n: n["status"]["conditions"].append({"type": CONDITION_TYPE, "status": "False"}),
            id="condition",
        ),
        pytest.param("", add_taint(TAINT_KEY), id="taint"),
        pytest.param("", annotate(APPLIED_ANNOTATION), id="annotation"),
    ],
)
def test_policy_admits_nvdp_taking_its_marks_off_its_own_node(
    render: Callable[..., Rendered], subresource: str, withdrawn: Callable[[Doc], object]
) -> None:
    """At uninstall each pod removes the condition, taint and annotation it wrote on its Node."""
    spec = named(render({"rbac": {"ownNodePolicy": True}}), "ValidatingAdmissionPolicy")[POLICY]["spec"]
    new = gpu_node()
    new["status"]["conditions"] = [c for c in new["status"]["conditions"] if c["type"] != CONDITION_TYPE]
    token = {"username": PLUGIN_ACCOUNT, "extra": {"authentication.kubernetes.io/node-name": [OWN]}}
    for name in (OWN, OTHER):
        old = copy.deepcopy(new)
        old["metadata"]["name"] = name
        withdrawn(old)
        mine = copy.deepcopy(new)
        mine["metadata"]["name"] = name
        request = {"operation": "UPDATE", "subResource": subresource, "userInfo": token}
        said = admission(spec, {"request": request, "object": mine, "oldObject": old})
        assert (said is None) is (name == OWN), said


def test_policy_admits_the_writes_nvdp_sends(render: Callable[..., Rendered]) -> None:
    """The Node writes as nvdp's code sends them (the health condition and taint of
    nvdp.node.health.node_condition, the config-manager's annotation), applied by the API stand-in: each
    admitted on the pod's own Node."""
    spec = named(render({"rbac": {"ownNodePolicy": True}}), "ValidatingAdmissionPolicy")[POLICY]["spec"]
    path = f"/api/v1/nodes/{OWN}"
    with KubeApiStandin() as api:
        api.put(path, gpu_node())
        client = new_api_client(host=api.url, retries=0)
        status = KubeNodeStatus(OWN, api_client=client)

        def health(condition: GpuHealthCondition, effect: str | None) -> None:
            body = condition_body(condition, status.read().condition(CONDITION_TYPE), NOW)
            assert body is not None
            admitted(lambda: status.patch_condition(body), "status")
            node = status.read()  # the status patch moved the Node's resourceVersion
            taints = taints_with(node.taints, condition.taint, effect, NOW)
            assert taints is not None
            admitted(lambda: status.replace_taints(taints, node.resource_version), "")

        def admitted(write: Callable[[], object], subresource: str) -> None:
            old = copy.deepcopy(api.objects[path])
            write()
            request = {
                "operation": "UPDATE",
                "subResource": subresource,
                "userInfo": {
                    "username": PLUGIN_ACCOUNT,
                    "extra": {"authentication.kubernetes.io/node-name": [OWN]},
                },
            }
            new = api.objects[path]
            assert new != old
            assert admission(spec, {"request": request, "object": new, "oldObject": old}) is None

        health(GpuHealthCondition("False", FATAL_XID, "GPU-0: XID 79", taint=FATAL_XID), "NoExecute")
        health(GpuHealthCondition("True", HEALTHY, "8 GPUs healthy"), None)
        admitted(lambda: NodeAnnotationRecord(client, OWN).write("a100"), "")


def admission(spec: Doc, data: dict[str, Any]) -> str | None:
    """None when the policy admits the request (or does not match it); else the first failing
    validation's message, as the API server answers a Deny."""
    if not all(evaluate(c["expression"], data) for c in spec["matchConditions"]):
        return None
    data = {**data, "variables": {}}
    for variable in spec["variables"]:
        data["variables"][variable["name"]] = evaluate(variable["expression"], data)
    for validation in spec["validations"]:
        if evaluate(validation["expression"], data) is not True:
            message = validation.get("message") or evaluate(validation["messageExpression"], data)
            return str(message)
    return None


def evaluate(expression: str, data: Mapping[str, Any]) -> Any:
    reason = "cel-expr-python (the test extra) evaluates CEL"
    cel = pytest.importorskip("cel_expr_python.cel", reason=reason)
    ext_optional = pytest.importorskip("cel_expr_python.ext.ext_optional", reason=reason)
    names = ("request", "object", "oldObject", "variables")
    env = cel.NewEnv(variables={n: cel.Type.DYN for n in names}, extensions=[ext_optional.ExtOptional()])
    return env.compile(expression).eval(data=dict(data)).plain_value()
