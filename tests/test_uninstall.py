"""After `helm uninstall`, what the processes wrote for the node goes; after a restart, a rolling
update or a drain it stays. A SIGTERMed process asks the API stand-in whether its pod's DaemonSet is
gone or being deleted: the device plugin then removes its GPU health condition, its taint and its
hand-over record, the config-manager its Node annotation, the DRA plugin its hand-over record and
its checkpoint, each only where nothing holds a GPU or a prepared claim. The chart's pre-delete hook
(`nvdp delete-daemonsets`) deletes the DaemonSets in the foreground and waits for their pods, so that
they clean up while their RBAC stands; the chart gives the pods their name, namespace and a Role to
read their DaemonSet, and the hook a Role to delete those DaemonSets alone."""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nvdp import kube
from nvdp.base.errors import KubeError
from nvdp.base.timers import as_env
from nvdp.node.health.condition import CONDITION_TYPE, TAINT_KEY
from nvdp.node.health.node_condition import withdraw
from nvdp.plugins.handoff import DEVICE_PLUGIN, DRA, Handoff
from nvdp.plugins.uninstall import Release, release_from_env, remove_handoff_record
from nvdp.side.configmanager.command import remove_record
from nvdp.side.configmanager.settings import APPLIED_ANNOTATION
from nvdp.sim.kubelet import Kubelet
from testkit import Process, clean_env, start_plugin, wait_until
from tests import test_chart_all_on, test_chart_rbac, test_config_manager, test_deploy
from tests.builders import append_sim_event, sim_gpus
from tests.dra_support import dra_cluster, make_claim, schedule, slices_of
from tests.kube_api_standin import KubeApiStandin
from tests.test_config_manager import Setup
from tests.test_deploy import Rendered

setup = test_config_manager.setup  # the config-manager's fixtures, by name

NAMESPACE = "gpu-system"
POD = "nvdp-abcde"
DAEMONSET = "nvdp"
DAEMONSET_UID = "uid-daemonset"
NODE_PATH = test_config_manager.NODE_PATH  # node-a
POD_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
DAEMONSET_PATH = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{DAEMONSET}"
POD_ENV = {"POD_NAME": POD, "POD_NAMESPACE": NAMESPACE}
PCIE = sim_gpus("pcie-4")
TAINTING = "version: v1\nhealth:\n  taintOnFatal: NoSchedule\n"
# What the DaemonSet is when the pod gets SIGTERM, and whether that is an uninstall.
STATES = [
    pytest.param("present", False, id="restart-daemonset-present"),
    pytest.param("deleting", True, id="uninstall-daemonset-being-deleted"),
    pytest.param("gone", True, id="uninstall-daemonset-gone"),
]


def put_release(api: KubeApiStandin, daemonset: str, *, owned: bool = True) -> None:
    """The pod (owned by the DaemonSet unless not `owned`) and the DaemonSet: "present", "deleting"
    (a deletionTimestamp: foreground deletion), "gone", or "replaced" (the name, another UID)."""
    owners = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMONSET, "uid": DAEMONSET_UID}]
    metadata: dict[str, Any] = {"name": POD, "namespace": NAMESPACE, "uid": "uid-pod"}
    api.put(POD_PATH, {"metadata": {**metadata, **({"ownerReferences": owners} if owned else {})}})
    if daemonset == "gone":
        if DAEMONSET_PATH in api.objects:
            api.delete(DAEMONSET_PATH)
        return
    ds_meta: dict[str, Any] = {"name": DAEMONSET, "namespace": NAMESPACE}
    ds_meta["uid"] = "uid-another" if daemonset == "replaced" else DAEMONSET_UID
    if daemonset == "deleting":
        ds_meta["deletionTimestamp"] = "2026-12-05T14:00:00Z"
    api.put(DAEMONSET_PATH, {"metadata": ds_meta})


@pytest.fixture
def api() -> Iterator[KubeApiStandin]:
    """The API stand-in serving node-a (also the config-manager's `setup`'s API)."""
    with KubeApiStandin() as standin:
        node = {"kind": "Node", "metadata": {"name": "node-a", "labels": {}}, "spec": {}, "status": {}}
        standin.put(NODE_PATH, node)
        yield standin


# ---- telling an uninstall from a restart ----------------------------------------------------------


@pytest.mark.parametrize(
    ("daemonset", "owned", "removed"),
    [
        pytest.param("present", True, False, id="present"),
        pytest.param("deleting", True, True, id="being-deleted"),
        pytest.param("gone", True, True, id="gone"),
        pytest.param("replaced", True, True, id="replaced-same-name-other-uid"),
        pytest.param("gone", False, False, id="pod-owned-by-no-daemonset"),
    ],
)
def test_the_pods_daemonset_says_whether_the_release_goes(
    api: KubeApiStandin, daemonset: str, owned: bool, removed: bool
) -> None:
    put_release(api, daemonset, owned=owned)
    client = kube.new_api_client(host=api.url)
    assert kube.owner_daemonset_removed(client, NAMESPACE, POD, timeout=3) is removed


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        pytest.param("no-pod", f"cannot read pod {NAMESPACE}/{POD}: HTTP 404", id="pod-missing"),
        pytest.param(
            "daemonset-500", f"cannot read daemonset {NAMESPACE}/{DAEMONSET}: HTTP 500", id="api-failing"
        ),
    ],
)
def test_any_doubt_counts_as_a_restart(
    api: KubeApiStandin, caplog: pytest.LogCaptureFixture, fault: str, error: str
) -> None:
    if fault == "daemonset-500":
        put_release(api, "gone")
        api.fail(500, 5, path_prefix=DAEMONSET_PATH)
    release = Release(lambda: kube.new_api_client(host=api.url, retries=0), NAMESPACE, POD)
    with pytest.raises(KubeError) as raised:
        kube.owner_daemonset_removed(release.api_client, NAMESPACE, POD, timeout=3)
    assert str(raised.value).startswith(error)
    with caplog.at_level(logging.WARNING, logger="nvdp.plugins.uninstall"):
        assert release.removed() is False
    assert [r.getMessage() for r in caplog.records] == [
        "cannot tell an uninstall from a restart; the node's records stay"
    ]


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({"POD_NAMESPACE": NAMESPACE}, id="no-pod-name"),
        pytest.param({"POD_NAME": POD}, id="no-namespace"),
        pytest.param(POD_ENV, id="no-api-server"),
    ],
)
def test_a_process_that_cannot_ask_keeps_everything(environ: dict[str, str], tmp_path: Path) -> None:
    assert release_from_env(environ, token_file=str(tmp_path / "no-token")) is None


# ---- the hand-over record ----------------------------------------------------------------------


def stopped_record(directory: Path, api: str, holds: dict[str, str]) -> Handoff:
    """A record as a stopped process leaves it: serving nothing, holding `holds`; its lock released."""
    handoff = Handoff(api, directory)
    handoff.settle(frozenset({PCIE[0].uuid}), holds)
    handoff.served(frozenset({PCIE[0].uuid}))
    handoff.served(frozenset())
    handoff.close()
    return handoff


@pytest.mark.parametrize("api_name", [DEVICE_PLUGIN, DRA])
@pytest.mark.parametrize(
    ("holds", "removed"),
    [
        pytest.param({}, True, id="nothing-held"),
        pytest.param({PCIE[0].uuid: "pod default/train"}, False, id="a-gpu-held"),
    ],
)
def test_the_record_goes_unless_it_holds_a_gpu(
    tmp_path: Path, api_name: str, holds: dict[str, str], removed: bool
) -> None:
    directory = tmp_path / "gpu.nvidia.com"
    directory.mkdir()
    handoff = stopped_record(directory, api_name, holds)
    assert remove_handoff_record(handoff) is removed
    names = sorted(p.name for p in directory.iterdir())
    assert names == ([] if removed else [f"served-by-{api_name}.json", f"served-by-{api_name}.lock"])
    if not removed:
        assert json.loads((directory / f"served-by-{api_name}.json").read_text())["holds"] == holds


@pytest.mark.parametrize(
    "case",
    [
        pytest.param("unreadable", id="record-unreadable"),
        pytest.param("locked", id="another-process-holds-the-lock"),
    ],
)
def test_a_record_in_doubt_stays(tmp_path: Path, case: str) -> None:
    directory = tmp_path / "gpu.nvidia.com"
    directory.mkdir()
    handoff = stopped_record(directory, DEVICE_PLUGIN, {})
    record, lock = directory / "served-by-device-plugin.json", directory / "served-by-device-plugin.lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        if case == "unreadable":
            record.write_text('{"serving": [')
        else:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new pod of the same API runs
        assert remove_handoff_record(handoff) is False
        assert record.exists() and lock.exists()
    finally:
        os.close(fd)


# ---- the device plugin --------------------------------------------------------------------------


@pytest.mark.parametrize(("daemonset", "uninstalled"), STATES)
def test_the_plugin_removes_its_condition_taint_and_record_only_at_uninstall(
    sock_dir: Path, tmp_path: Path, api: KubeApiStandin, daemonset: str, uninstalled: bool
) -> None:
    """Fatal XIDs on every GPU leave the Node condition False and tainted; SIGTERM with the DaemonSet standing
    (a restart) keeps both and the record for the next pod; with the DaemonSet deleted, they go."""
    put_release(api, "present")
    kubelet_dir = sock_dir / "device-plugins"
    kubelet_dir.mkdir()
    (sock_dir / "plugins").mkdir()  # the kubelet's plugins directory: the record's is made in it
    records = sock_dir / "plugins" / "gpu.nvidia.com"
    config, events = tmp_path / "config.yaml", tmp_path / "events.jsonl"
    config.write_text(TAINTING)
    events.touch()
    env = {
        **POD_ENV,
        **as_env(node_condition_pacing=0.1),  # a second write (XIDs seen in two syncs): 0.1 s after, not 1 s
        "NVDP_SIM_EVENTS": str(events),
        "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
        "NODE_NAME": "node-a",
    }
    kubelet = Kubelet(kubelet_dir)
    kubelet.start()
    plugin: Process | None = None
    try:
        plugin = start_plugin(
            kubelet_dir, "sim:pcie-4", config_file=config, env=env, log_path=tmp_path / "plugin.log"
        )
        kubelet.wait_for_registration("nvidia.com/gpu", timeout=30)
        for gpu in PCIE:  # the taint comes when no GPU is left
            append_sim_event(events, uuid=gpu.uuid, xid=79)

        def node() -> dict[str, Any]:
            return api.objects[NODE_PATH]

        def ours() -> tuple[list[str], list[str]]:
            conditions = [
                c["status"] for c in node()["status"].get("conditions") or [] if c["type"] == CONDITION_TYPE
            ]
            taints = [t["effect"] for t in node()["spec"].get("taints") or [] if t["key"] == TAINT_KEY]
            return conditions, taints

        wait_until(lambda: ours() == (["False"], ["NoSchedule"]), 20, "condition False and the taint")
        wait_until(lambda: (records / "served-by-device-plugin.json").exists(), 10, "the record")
        put_release(api, daemonset)
        assert plugin.stop(timeout=20) == 0
        log = plugin.log()
        assert "node condition not written" not in log  # the taints at the read, then the condition: no 409
        if uninstalled:
            assert ours() == ([], [])
            assert sorted(p.name for p in records.iterdir()) == []
            assert "DaemonSet removed (uninstall)" in log and "node condition removed" in log
        else:
            assert ours() == (["False"], ["NoSchedule"])
            assert (records / "served-by-device-plugin.json").exists()
            assert "DaemonSet removed" not in log
    finally:
        if plugin is not None:
            plugin.stop()
            print(plugin.log()[-6000:])
        kubelet.stop()


# ---- the config-manager -------------------------------------------------------------------------


@pytest.mark.parametrize(("daemonset", "uninstalled"), STATES)
def test_the_config_manager_removes_its_annotation_only_at_uninstall(
    setup: Setup, daemonset: str, uninstalled: bool
) -> None:
    api = setup.api
    put_release(api, "present")
    setup.label("a")
    manager = setup.manager(**POD_ENV)

    def annotation() -> str | None:
        return (api.objects[NODE_PATH]["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION)

    wait_until(lambda: annotation() == "a", 20, "the applied entry recorded")
    put_release(api, daemonset)
    assert manager.stop(timeout=20) == 0
    assert annotation() == (None if uninstalled else "a")
    assert api.objects[NODE_PATH]["metadata"]["labels"] == {test_config_manager.LABEL: "a"}  # the user's


# ---- the DRA kubelet plugin ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("daemonset", "prepared", "removed"),
    [
        pytest.param("present", False, False, id="restart"),
        pytest.param("deleting", False, True, id="uninstall-nothing-prepared"),
        pytest.param("gone", True, False, id="uninstall-a-claim-prepared"),
    ],
)
def test_the_dra_plugin_removes_its_record_and_checkpoint_unless_a_claim_is_prepared(
    tmp_path: Path, daemonset: str, prepared: bool, removed: bool
) -> None:
    with dra_cluster(tmp_path, env=POD_ENV) as cluster:
        put_release(cluster.api, "present")
        process = cluster.start()
        cluster.registered()
        wait_until(lambda: slices_of(cluster.api), 10, "the slice")
        claim = make_claim(cluster.api, "one-gpu")
        assert schedule(cluster.api, claim) == ["gpu-0"]
        cluster.kubelet.start_pod("pod-1", "gpu.nvidia.com", [claim])
        if not prepared:
            assert cluster.kubelet.end_pod("pod-1", "gpu.nvidia.com", [claim]) == [claim.uid]
        directory = cluster.node.checkpoint.parent
        # Stopped at once: the plugin's loop may not have settled the (un)prepare yet; its stop writes
        # the record's holds as they are before it decides what an uninstall leaves.
        put_release(cluster.api, daemonset)
        assert process.stop(timeout=20) == 0
        left = sorted(p.name for p in directory.iterdir() if not p.name.endswith(".sock"))
        if removed:
            assert left == []
        else:
            assert left == ["checkpoint.json", "served-by-dra.json", "served-by-dra.lock"]
        if prepared:  # the claim's CDI spec stays: the pod's containers may still run
            assert cluster.specs() != {}
            holds = json.loads((directory / "served-by-dra.json").read_text())["holds"]
            assert list(holds.values()) == [f"claim {claim.namespace}/{claim.name}"]


# ---- the chart's pre-delete hook: `nvdp delete-daemonsets` -----------------------------------------


def delete_daemonsets(api: KubeApiStandin, tmp_path: Path, *names: str, wait: str = "60") -> Process:
    argv = [sys.executable, "-m", "nvdp.cli", "delete-daemonsets", "--namespace", NAMESPACE, *names]
    argv += ["--wait", wait, "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig"))]
    return Process(argv, tmp_path / "hook.log", clean_env())


def test_the_hook_deletes_the_daemonsets_in_the_foreground_and_waits_for_their_pods(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    """The DaemonSets stay, marked, until their pods are gone (the stand-in: until the test deletes
    them); only then does the hook end and Helm go on to delete the RBAC the pods cleaned up with."""
    api.foreground_deletes = True
    put_release(api, "present")
    other = DAEMONSET_PATH + "-dra"
    api.put(other, {"metadata": {"name": DAEMONSET + "-dra", "uid": "uid-dra"}})
    hook = delete_daemonsets(api, tmp_path, DAEMONSET, DAEMONSET + "-dra", "not-rendered")
    marked = [DAEMONSET_PATH, other]
    wait_until(
        lambda: all("deletionTimestamp" in api.objects[p]["metadata"] for p in marked), 20, "both marked"
    )
    client = kube.new_api_client(host=api.url)
    assert kube.owner_daemonset_removed(client, NAMESPACE, POD, timeout=3)  # what the pods see
    wait_until(lambda: "waiting for the DaemonSets' pods to stop" in hook.log(), 10, "the wait said")
    assert hook.popen.poll() is None
    api.delete(DAEMONSET_PATH)
    api.delete(other)
    assert hook.popen.wait(20) == 0
    assert "DaemonSets deleted" in hook.log()


def test_a_daemonset_that_does_not_go_is_said_and_the_uninstall_goes_on(
    api: KubeApiStandin, tmp_path: Path
) -> None:
    api.foreground_deletes = True
    put_release(api, "present")
    hook = delete_daemonsets(api, tmp_path, DAEMONSET, wait="0.5")
    assert hook.popen.wait(20) == 0
    assert f"DaemonSets still there; their pods may not have cleaned up the node daemonsets={DAEMONSET}" in (
        hook.log()
    )


def test_a_hook_without_rbac_says_so_and_the_uninstall_goes_on(api: KubeApiStandin, tmp_path: Path) -> None:
    put_release(api, "present")
    api.fail(403, 1, method="DELETE")
    hook = delete_daemonsets(api, tmp_path, DAEMONSET, wait="5")
    assert hook.popen.wait(20) == 0
    assert f'DaemonSet not deleted error="cannot delete daemonset {NAMESPACE}/{DAEMONSET}: HTTP 403' in (
        hook.log()
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        pytest.param(["--namespace", "ns"], "the following arguments are required: DAEMONSET", id="no-name"),
        pytest.param(
            ["x"], "error: --namespace: not given, and no pod namespace to default to", id="no-namespace"
        ),
        pytest.param(
            ["x", "--namespace", "ns", "--wait", "-1"],
            'error: --wait / DELETE_WAIT: must be >= 0, got "-1"',
            id="negative-wait",
        ),
        pytest.param(
            ["x", "--namespace", "ns", "--wait", "soon"],
            'error: --wait / DELETE_WAIT: invalid duration "soon"',
            id="wait-not-a-duration",
        ),
    ],
)
def test_the_hooks_command_line_is_checked(argv: list[str], error: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "delete-daemonsets", *argv],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode != 0
    assert error in done.stderr and len(done.stderr.strip().splitlines()) == 1


# ---- the chart ----------------------------------------------------------------------------------

renderer = test_deploy.renderer  # fixtures shared with the chart's main tests
render = test_deploy.render
EVERYTHING: dict[str, Any] = {  # every DaemonSet of the chart: plugin, GFD, MPS daemon, DRA plugin
    **test_chart_all_on.VALUES,
    "dra": {"enabled": True},
}
HOOK = {
    "helm.sh/hook": "pre-delete",
    "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
}


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_the_pods_may_read_their_daemonset_and_nothing_more(render: Callable[..., Rendered]) -> None:
    out = render(EVERYTHING)
    daemonsets = sorted(by_kind(out.docs, "DaemonSet"))
    assert len(daemonsets) == 4
    role = by_kind(out.docs, "Role")[test_deploy.UNINSTALL_RBAC]
    assert role["metadata"]["namespace"] == test_deploy.NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},  # its own pod: the owner
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": daemonsets, "verbs": ["get"]},
    ]
    binding = by_kind(out.docs, "RoleBinding")[test_deploy.UNINSTALL_RBAC]
    accounts = {
        d["spec"]["template"]["spec"]["serviceAccountName"] for d in by_kind(out.docs, "DaemonSet").values()
    }
    assert {s["name"] for s in binding["subjects"]} == accounts
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    # Each process that cleans up at stop knows its pod and namespace; the init containers do not stop so.
    fields = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    cleaning = {
        name: ctr
        for name, ctr in test_chart_all_on.containers(out).items()
        if ctr["command"][-1] in ("nvidia-device-plugin", "gpu-kubelet-plugin") or name.endswith("-sidecar")
    }
    assert len(cleaning) == 2 + 4  # the two plugins; the config-manager sidecar of each of the 4 pods
    for name, ctr in cleaning.items():
        env = test_deploy.container_env(ctr)
        assert {k: env[k]["fieldRef"]["fieldPath"] for k in fields} == fields, name
    for doc in out.docs + out.hooks:
        test_deploy.check_schema(doc)


def test_the_hook_may_delete_the_releases_daemonsets_and_goes_after(render: Callable[..., Rendered]) -> None:
    out = render(EVERYTHING)
    daemonsets = sorted(by_kind(out.docs, "DaemonSet"))
    assert [d["kind"] for d in out.hooks] == ["ServiceAccount", "Role", "RoleBinding", "Job"]
    for doc in out.hooks:
        annotations = doc["metadata"]["annotations"]
        assert {k: annotations[k] for k in HOOK} == HOOK
        # the RBAC first, the Job after it
        assert annotations["helm.sh/hook-weight"] == ("0" if doc["kind"] == "Job" else "-10")
    account, role, binding, job = out.hooks
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": daemonsets,
            "verbs": ["get", "delete"],
        }
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": test_deploy.NAMESPACE}
    ]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    (ctr,) = pod["containers"]
    assert ctr["command"][:2] == ["nvdp", "delete-daemonsets"] and ctr["args"] == daemonsets


def test_the_rendered_hook_deletes_the_rendered_daemonsets(
    render: Callable[..., Rendered], api: KubeApiStandin, tmp_path: Path
) -> None:
    """The Job's command line, run against the API stand-in holding the release's DaemonSets."""
    out = render(EVERYTHING)
    api.foreground_deletes = True
    paths = []
    for name in by_kind(out.docs, "DaemonSet"):
        paths.append(f"/apis/apps/v1/namespaces/{test_deploy.NAMESPACE}/daemonsets/{name}")
        api.put(paths[-1], {"metadata": {"name": name, "uid": f"uid-{name}"}})
    (ctr,) = out.hooks[-1]["spec"]["template"]["spec"]["containers"]
    argv = [sys.executable, "-m", "nvdp.cli", *ctr["command"][1:], *ctr["args"]]
    argv += ["--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig"))]
    hook = Process(argv, tmp_path / "hook.log", clean_env())
    wait_until(
        lambda: all("deletionTimestamp" in api.objects[p]["metadata"] for p in paths), 20, "all marked"
    )
    for path in paths:
        api.delete(path)
    assert hook.popen.wait(20) == 0


@pytest.mark.parametrize(
    ("values", "role", "hooks"),
    [
        pytest.param({}, True, True, id="default"),
        pytest.param({"uninstallCleanup": False}, True, False, id="no-hook"),
        pytest.param({"rbac": {"create": False}}, False, False, id="no-rbac"),
    ],
)
def test_the_cleanup_follows_the_values(
    render: Callable[..., Rendered], values: dict[str, Any], role: bool, hooks: bool
) -> None:
    out = render(values)
    assert (test_deploy.UNINSTALL_RBAC in by_kind(out.docs, "Role")) is role
    assert bool(out.hooks) is hooks


def test_a_config_manager_that_stays_records_its_entry_again(setup: Setup) -> None:
    """Another pod's config-manager removed the annotation (its DaemonSet alone was deleted: GFD
    turned off by an upgrade); this one, whose DaemonSet stays, records the entry again."""
    api = setup.api
    put_release(api, "present")
    setup.label("a")
    setup.manager(**POD_ENV)

    def annotation() -> str | None:
        return (api.objects[NODE_PATH]["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION)

    wait_until(lambda: annotation() == "a", 20, "the applied entry recorded")
    api.merge_patch(NODE_PATH, {"metadata": {"annotations": {APPLIED_ANNOTATION: None}}})
    assert annotation() is None
    wait_until(lambda: annotation() == "a", 20, "the applied entry recorded again")


def test_the_own_node_policy_admits_the_cleanup_as_the_code_sends_it(render: Callable[..., Rendered]) -> None:
    """The taint, condition and annotation removals, as `withdraw` and the config-manager send them
    and the API stand-in applies them, each admitted by the chart's own-Node policy."""
    spec = by_kind(render({"rbac": {"ownNodePolicy": True}}).docs, "ValidatingAdmissionPolicy")
    policy = spec[test_chart_rbac.POLICY]["spec"]
    own = test_chart_rbac.OWN
    path = f"/api/v1/nodes/{own}"
    node = test_chart_rbac.gpu_node()
    (condition,) = [c for c in node["status"]["conditions"] if c["type"] == CONDITION_TYPE]
    condition.update(status="False", reason="FatalXid")
    test_chart_rbac.add_taint(TAINT_KEY)(node)
    test_chart_rbac.annotate(APPLIED_ANNOTATION)(node)
    token = {
        "username": test_chart_rbac.PLUGIN_ACCOUNT,
        "extra": {"authentication.kubernetes.io/node-name": [own]},
    }
    with KubeApiStandin() as api:
        api.put(path, node)
        client = kube.new_api_client(host=api.url, retries=0)
        status = kube.KubeNodeStatus(own, api_client=client)
        subresources: list[str] = []

        class Admitted:
            """KubeNodeStatus, each write checked against the policy."""

            def read(self) -> kube.NodeConditionsAndTaints:
                return status.read()

            def remove_condition(self, condition_type: str) -> None:
                self._checked(lambda: status.remove_condition(condition_type), "status")

            def replace_taints(self, taints: Sequence[Mapping[str, object]], resource_version: str) -> None:
                self._checked(lambda: status.replace_taints(taints, resource_version), "")

            def _checked(self, write: Callable[[], None], subresource: str) -> None:
                old = copy.deepcopy(api.objects[path])
                write()
                request = {"operation": "UPDATE", "subResource": subresource, "userInfo": token}
                data = {"request": request, "object": api.objects[path], "oldObject": old}
                assert test_chart_rbac.admission(policy, data) is None
                subresources.append(subresource)

        checked = Admitted()
        withdraw(checked)
        checked._checked(lambda: remove_record(client, own, 3.0), "")
        assert subresources == ["", "status", ""]  # the taint, the condition, the annotation
        stored = api.objects[path]
        assert [c["type"] for c in stored["status"]["conditions"]] == ["Ready"]
        assert stored["spec"]["taints"] == [t for t in node["spec"]["taints"] if t["key"] != TAINT_KEY]
        assert stored["metadata"]["annotations"] == {"node.alpha.kubernetes.io/ttl": "0"}
