"""The chart with everything on at once (real Helm engine): several config entries (MIG, time-slicing,
MPS), GFD, a CDI device list strategy, metrics with a ServiceMonitor and a PodMonitor. Every object is
valid against the Kubernetes schemas, every container reads only env vars its program knows, every
config entry passes `nvdp config check`, and each feature's objects are there together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvdp.side.configmanager.check import check
from tests import test_deploy as deploy
from tests.test_deploy import CONTAINER, PROGRAM_ENV, Rendered, check_plugin_daemonset, check_schema

renderer = deploy.renderer  # fixtures shared with the chart's main tests

Doc = dict[str, Any]

ENTRIES = {
    "default": "version: v1\nflags:\n  migStrategy: none\n",
    "mig": (
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n"
    ),
    "shared": (
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    ),
    "mps": "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
}

VALUES: Doc = {
    "config": {"map": ENTRIES, "default": "default"},
    "deviceListStrategy": "cdi-cri",
    "gfd": {"enabled": True},
    "nfd": {"enabled": False},
    "metrics": {
        "forceMonitors": True,
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
    },
}

# env vars the chart sets for the kubelet, the runtime or the Kubernetes client, not read by nvdp
OUTSIDE_ENV = deploy.OTHER_ENV | {"KUBERNETES_NAMESPACE", "POD_NAMESPACE"}


@pytest.fixture(scope="module")
def all_on(renderer: deploy.Renderer) -> Rendered:
    return Rendered(renderer(VALUES, deploy.NAMESPACE, ()))


def containers(out: Rendered) -> dict[str, Doc]:
    """Every container and init container of every DaemonSet, by DaemonSet and container name."""
    found: dict[str, Doc] = {}
    for daemonset in (d for d in out.docs if d["kind"] == "DaemonSet"):
        pod = daemonset["spec"]["template"]["spec"]
        for ctr in pod.get("initContainers", []) + pod["containers"]:
            found[f"{daemonset['metadata']['name']}/{ctr['name']}"] = ctr
    return found


def test_everything_renders_valid_objects(all_on: Rendered) -> None:
    assert sorted(set(all_on.kinds())) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "PodMonitor",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    for doc in all_on.docs:
        check_schema(doc)
    names = [d["metadata"]["name"] for d in all_on.docs]
    kinds_names = [(d["kind"], d["metadata"]["name"]) for d in all_on.docs]
    assert len(set(kinds_names)) == len(kinds_names), f"two objects share a kind and name: {names}"


def test_each_feature_is_there_together(all_on: Rendered) -> None:
    sets = {
        d["spec"]["template"]["spec"]["containers"][0]["name"]: d
        for d in all_on.docs
        if d["kind"] == "DaemonSet"
    }
    assert sorted(sets) == ["gpu-feature-discovery-ctr", "mps-control-daemon-ctr", CONTAINER]
    plugin = sets[CONTAINER]
    check_plugin_daemonset(plugin)
    pod = plugin["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-cri"
    assert env["MPS_ROOT"] == "/run/nvidia/mps"
    assert env["CONFIG_FILE"] == "/config/config.yaml"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/var/run/cdi", "/driver-root", "/run/nvidia/mps", "/config"} <= mounts
    # the config-manager pair runs beside the plugin and beside GFD
    for name in (CONTAINER, "gpu-feature-discovery-ctr"):
        spec = sets[name]["spec"]["template"]["spec"]
        sidecars = [c for c in spec["containers"] if c["name"] != name]
        inits = spec.get("initContainers", [])
        assert any("config-manager" in c.get("command", []) + c.get("args", []) for c in sidecars), name
        assert any("config-manager" in c.get("command", []) + c.get("args", []) for c in inits), name


def test_every_container_reads_only_env_its_program_knows(all_on: Rendered) -> None:
    from nvdp.node.mps.command import HEALTH_ENV
    from nvdp.side.configmanager.settings import OPTIONS as MANAGER_OPTIONS
    from nvdp.side.gfd.options import GFD_OPTIONS

    known = set(PROGRAM_ENV) | OUTSIDE_ENV | {HEALTH_ENV}
    known |= {env for option in (*MANAGER_OPTIONS, *GFD_OPTIONS) for env in option.envs}
    unknown = {
        name: sorted({e["name"] for e in ctr.get("env", [])} - known)
        for name, ctr in containers(all_on).items()
    }
    assert {k: v for k, v in unknown.items() if v} == {}


def test_every_config_entry_passes_config_check(all_on: Rendered, tmp_path: Path) -> None:
    (config_map,) = (d for d in all_on.docs if d["kind"] == "ConfigMap")
    assert sorted(config_map["data"]) == sorted(ENTRIES)
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    report = check([str(tmp_path)], nvml="sim:dgx-a100-mig")
    assert (report.errors, report.status) == ([], 0), report.lines
