"""The chart's DRA kubelet plugin (dra.enabled), rendered by the real Helm engine: its DaemonSet (the
command, NVIDIA's env names, every one read by the program, the kubelet's directories and the CDI
root mounted, maxSurge 0), NVIDIA's DeviceClasses, its RBAC (ResourceSlices written, ResourceClaims
only read) and the admission policy that keeps it to its own node's slices. One GPU, one API: with a
ConfigMap of entries the DRA pod follows the node's config label as the device plugin's does (the
config-manager pair, signalling gpu-kubelet-plugin), and the device plugin's pod mounts the DRA
plugin's directory, where the two hand GPUs over; its probes and metrics port (a port of its own), a
PodMonitor for it; the DRA container runs as rendered and answers its probes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from nvdp.config.model import DEFAULT_KUBELET_SOCKET
from nvdp.plugins.dra.names import DRIVER_NAME
from nvdp.plugins.dra.options import DRA_OPTIONS
from nvdp.plugins.handoff import device_plugin_record_dir
from nvdp.sim.dra.scheduler import nvidia_device_classes
from testkit import Process, clean_env, free_port, wait_until
from tests import test_deploy as deploy
from tests.dra_support import dra_cluster, published
from tests.readings import http_get
from tests.test_chart_gfd import console_script_argv, env_value, plugin_daemonset
from tests.test_deploy import (
    NAMESPACE,
    UNINSTALL_RBAC,
    Doc,
    Rendered,
    _find_renderer,
    check_schema,
    container,
    container_env,
    volume,
    without,
)
from tests.test_dra_config_manager import ENTRIES

renderer, render_error = deploy.renderer, deploy.render_error  # fixtures shared with the chart's tests
DRA_ENV = frozenset(
    {env for o in DRA_OPTIONS for env in o.envs}
    | {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "POD_NAME", "POD_NAMESPACE"}
)
ENABLED = {"dra": {"enabled": True}}
# NVIDIA's DRA chart's DeviceClasses, rendered (the file names its source).
NVIDIA_DEVICE_CLASSES = Path(__file__).parent / "data" / "chart" / "nvidia-dra-deviceclasses.yaml"
DRA_PROCESS = "gpu-kubelet-plugin"  # the console script: the container's command, PROCESS_TO_SIGNAL
WITH_ENTRIES = {**ENABLED, "config": {"map": ENTRIES, "default": "device-plugin"}}
# The DRA plugin's directory as the device plugin finds it in its container: beside the directory of
# its kubelet socket (device-plugins/../plugins/gpu.nvidia.com).
DRA_DIR_IN_PLUGIN = str(device_plugin_record_dir(Path(DEFAULT_KUBELET_SOCKET), DRIVER_NAME))


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


def nodes_verbs(role: Doc) -> list[str]:
    (verbs,) = [r["verbs"] for r in role["rules"] if r["resources"] == ["nodes"]]
    return list(verbs)


def test_nothing_of_dra_by_default(render: Callable[..., Rendered]) -> None:
    out = render()
    assert not [d for d in out.docs if "dra" in d["metadata"]["name"] or d["kind"] == "DeviceClass"]
    plugin = container(plugin_daemonset(out))
    assert not [m for m in plugin["volumeMounts"] if m["mountPath"].startswith("/var/lib/kubelet/plugins")]


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
    assert ctr["command"] == [DRA_PROCESS]
    assert "initContainers" not in pod and "shareProcessNamespace" not in pod  # no ConfigMap of entries
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
        "kubelet-pod-resources-dir": "/var/lib/kubelet/pod-resources",  # the device plugin's holds, read
    }
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes["plugins"] == "/var/lib/kubelet/plugins" and volumes["driver-root"] == "/run/nvidia/driver"
    assert volumes["kubelet-pod-resources-dir"] == "/var/lib/kubelet/pod-resources"
    assert {m["name"]: m.get("readOnly") for m in ctr["volumeMounts"]}["kubelet-pod-resources-dir"] is True
    assert ctr["securityContext"] == {"privileged": True}
    plugin_pod = plugin_daemonset(out)["spec"]["template"]["spec"]
    assert (pod["affinity"], pod["tolerations"]) == (plugin_pod["affinity"], plugin_pod["tolerations"])


def test_nvidias_device_classes(render: Callable[..., Rendered]) -> None:
    """NVIDIA's DRA chart's classes (test data), gpu.nvidia.com with extendedResourceName: nvidia.com/gpu
    (KEP-5004); the scheduler stand-in's classes select the same devices."""
    classes = named(render(ENABLED), "DeviceClass")
    nvidia = {d["metadata"]["name"]: d for d in deploy.load_docs(NVIDIA_DEVICE_CLASSES.read_text())}
    assert {n: {k: c[k] for k in ("apiVersion", "spec")} for n, c in classes.items()} == {
        n: {k: c[k] for k in ("apiVersion", "spec")} for n, c in nvidia.items()
    }
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert {n: c["spec"]["selectors"] for n, c in classes.items()} == {
        n: c["spec"]["selectors"] for n, c in nvidia_device_classes().items()
    }
    assert named(render({"dra": {"enabled": True, "deviceClasses": False}}), "DeviceClass") == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("example.com/accelerator", "example.com/accelerator"), ("", None)],
    ids=["another-name", "none"],
)
def test_device_class_extended_resource_name(
    render: Callable[..., Rendered], name: str, expected: str | None
) -> None:
    classes = named(render({"dra": {"enabled": True, "extendedResourceName": name}}), "DeviceClass")
    assert classes["gpu.nvidia.com"]["spec"].get("extendedResourceName") == expected
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]


@pytest.mark.parametrize("name", ["gpu", "nvidia.com/", "Nvidia.com/gpu", "nvidia.com/gpu/0"])
def test_device_class_extended_resource_name_refused(render_error: Callable[..., str], name: str) -> None:
    said = render_error({"dra": {"enabled": True, "extendedResourceName": name}})
    assert (
        f'dra.extendedResourceName: invalid value "{name}" (accepted: an extended resource name, '
        'domain/name, e.g. nvidia.com/gpu; or "" for none)'
    ) in said


def test_the_kubelet_plugin_is_probed_on_a_metrics_port_of_its_own(render: Callable[..., Rendered]) -> None:
    """/healthz and /readyz on the container's `metrics` port, 2113 (not the device plugin's 2112,
    which may be the node's own), with the device plugin's probe settings; METRICS_ADDRESS says it."""
    out = render(ENABLED)
    daemonset, plugin = dra_daemonset(out), plugin_daemonset(out)
    check_schema(daemonset)
    ctr, plugin_ctr = daemonset["spec"]["template"]["spec"]["containers"][0], container(plugin)
    assert ctr["ports"] == [{"name": "metrics", "containerPort": 2113, "protocol": "TCP"}]
    assert container_env(ctr)["METRICS_ADDRESS"] == ":2113"
    assert container_env(plugin_ctr)["METRICS_ADDRESS"] == ":2112"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert ctr[probe] == plugin_ctr[probe]
        assert ctr[probe]["httpGet"] == {"path": path, "port": "metrics"}


@pytest.mark.parametrize(
    ("values", "address", "port"),
    [
        ({"dra": {"enabled": True, "metricsAddress": "0.0.0.0:9400"}}, "0.0.0.0:9400", 9400),
        ({"dra": {"enabled": True, "metricsAddress": "[::]:9400"}}, "[::]:9400", 9400),
        ({"dra": {"enabled": True, "metricsAddress": ""}}, "", None),
        ({"dra": {"enabled": True, "metricsAddress": None}}, "", None),
        ({**ENABLED, "metrics": {"enabled": False}}, "", None),
    ],
    ids=["ipv4", "ipv6", "empty", "null", "metrics-disabled"],
)
def test_the_kubelet_plugins_metrics_address(
    render: Callable[..., Rendered], values: Doc, address: str, port: int | None
) -> None:
    """Off is METRICS_ADDRESS="" said explicitly (the program's default is :2112), with no port and
    no probes."""
    ctr = dra_daemonset(render(values))["spec"]["template"]["spec"]["containers"][0]
    assert container_env(ctr)["METRICS_ADDRESS"] == address
    if port is None:
        assert not {"ports", "livenessProbe", "readinessProbe"} & set(ctr)
    else:
        assert ctr["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        assert ctr["readinessProbe"]["httpGet"]["port"] == "metrics"


@pytest.mark.parametrize("address", ["2113", "host:", ":0", ":65536", "a:b:2113"])
def test_a_bad_dra_metrics_address_fails_the_render(render_error: Callable[..., str], address: str) -> None:
    error = render_error({"dra": {"enabled": True, "metricsAddress": address}})
    assert (
        f'dra.metricsAddress: invalid address "{address}" (expected "[host]:port" with a port from 1 to'
        ' 65535, or "" to disable)'
    ) in error


def test_a_pod_monitor_scrapes_the_kubelet_plugin(render: Callable[..., Rendered]) -> None:
    monitors = {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}, "forceMonitors": True}
    out = render({**ENABLED, "metrics": monitors})
    daemonset = dra_daemonset(out)
    pod_monitors = named(out, "PodMonitor")
    assert len(pod_monitors) == 2  # the device plugin's, unchanged, and this one
    monitor = pod_monitors[daemonset["metadata"]["name"]]
    check_schema(monitor)
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [
        ("metrics", "/metrics")
    ]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    plugin_monitor = pod_monitors[plugin_daemonset(out)["metadata"]["name"]]
    assert (
        plugin_monitor
        == named(render({"metrics": monitors}), "PodMonitor")[plugin_monitor["metadata"]["name"]]
    )
    no_endpoint = render({"dra": {"enabled": True, "metricsAddress": ""}, "metrics": monitors})
    assert list(named(no_endpoint, "PodMonitor")) == [plugin_monitor["metadata"]["name"]]


def test_rbac_writes_slices_reads_claims_and_the_policy_keeps_it_to_its_node(
    render: Callable[..., Rendered],
) -> None:
    out = render(ENABLED)
    name = dra_daemonset(out)["spec"]["template"]["spec"]["serviceAccountName"]
    assert name in named(out, "ServiceAccount")
    role = named(out, "ClusterRole")[name]
    check_schema(role)
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): r["verbs"] for r in role["rules"]}
    assert rules[(("",), ("nodes",))] == ["get"]  # no config-manager in its pod: no list, watch, patch
    assert rules[(("resource.k8s.io",), ("resourceslices",))] == [
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


@pytest.mark.parametrize(
    "config",
    [{"map": ENTRIES, "default": "device-plugin"}, {"name": "site-configs", "default": "device-plugin"}],
    ids=["config.map", "config.name"],
)
def test_the_kubelet_plugin_follows_the_node_config_label(
    render: Callable[..., Rendered], config: Doc
) -> None:
    """With a ConfigMap of entries, the DRA pod gets the device plugin's config-manager pair
    (signalling gpu-kubelet-plugin), so both link the entry the node label selects."""
    out = render({**ENABLED, "config": config})
    daemonset, plugin = dra_daemonset(out), plugin_daemonset(out)
    check_schema(daemonset)
    pod, plugin_pod = daemonset["spec"]["template"]["spec"], plugin["spec"]["template"]["spec"]
    ctr, sidecar = pod["containers"]
    assert ctr["command"] == [DRA_PROCESS]
    assert container_env(ctr)["CONFIG_FILE"] == "/config/config.yaml"
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/config", "readOnly": True}
    assert mounts["available-configs"]["mountPath"] == "/available-configs"
    assert pod["shareProcessNamespace"] is True
    (init,) = pod["initContainers"]
    (plugin_init,) = plugin_pod["initContainers"]
    plugin_sidecar = plugin_pod["containers"][1]
    assert [init["name"], sidecar["name"]] == [f"{DRA_PROCESS}-init", f"{DRA_PROCESS}-sidecar"]
    for each in (init, sidecar):
        assert env_value(each, "PROCESS_TO_SIGNAL") == DRA_PROCESS
    # Otherwise the very same containers as the device plugin's: same label, source dir, default.
    assert without(init, "PROCESS_TO_SIGNAL") == without(plugin_init, "PROCESS_TO_SIGNAL")
    assert without(sidecar, "PROCESS_TO_SIGNAL") == without(plugin_sidecar, "PROCESS_TO_SIGNAL")
    for name in ("available-configs", "config"):
        assert volume(daemonset, name) == volume(plugin, name), name
    annotations = daemonset["spec"]["template"]["metadata"].get("annotations", {})
    plugin_annotations = plugin["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("checksum/config") == plugin_annotations.get("checksum/config")
    assert ("checksum/config" in annotations) is ("map" in config)


def test_the_kubelet_plugins_config_manager_may_read_the_node_and_the_config_map(
    render: Callable[..., Rendered],
) -> None:
    out = render(WITH_ENTRIES)
    account = dra_daemonset(out)["spec"]["template"]["spec"]["serviceAccountName"]
    plugin_account = plugin_daemonset(out)["spec"]["template"]["spec"]["serviceAccountName"]
    roles = named(out, "ClusterRole")
    plugin_role = next(r for name, r in roles.items() if name != account)
    # What the device plugin's config-manager may do with its Node: watch its label, note the entry.
    assert nodes_verbs(roles[account]) == nodes_verbs(plugin_role) == ["get", "list", "watch", "patch"]
    (binding,) = [b for name, b in named(out, "RoleBinding").items() if name != UNINSTALL_RBAC]
    (role,) = [r for name, r in named(out, "Role").items() if name != UNINSTALL_RBAC]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"][0]["resources"] == ["configmaps"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE} for name in (plugin_account, account)
    ]
    for doc in out.docs:
        check_schema(doc)


@pytest.mark.parametrize(
    "plugins_dir",
    ["/var/lib/kubelet/plugins", "/data/kubelet/plugins/"],
    ids=["default", "elsewhere"],
)
def test_the_device_plugin_sees_the_dra_plugins_directory(
    render: Callable[..., Rendered], plugins_dir: str
) -> None:
    """The host directory where the DRA plugin keeps its socket (under the one mounted at
    KUBELET_PLUGINS_DIRECTORY_PATH) is mounted, writable, where the device plugin looks for it; the
    device plugin's DaemonSet changes in nothing else."""
    out = render({"dra": {"enabled": True, "kubeletPluginsDirectoryPath": plugins_dir}})
    daemonset, plugin = dra_daemonset(out), plugin_daemonset(out)
    ctr = daemonset["spec"]["template"]["spec"]["containers"][0]
    plugins_mount = next(
        m
        for m in ctr["volumeMounts"]
        if m["mountPath"] == container_env(ctr)["KUBELET_PLUGINS_DIRECTORY_PATH"]
    )
    host_dir = str(PurePosixPath(volume(daemonset, plugins_mount["name"])["hostPath"]["path"]) / DRIVER_NAME)
    assert host_dir == str(PurePosixPath(plugins_dir) / DRIVER_NAME)
    (shared,) = [m for m in container(plugin)["volumeMounts"] if m["mountPath"] == DRA_DIR_IN_PLUGIN]
    assert not shared.get("readOnly")
    assert volume(plugin, shared["name"])["hostPath"] == {"path": host_dir, "type": "DirectoryOrCreate"}
    check_schema(plugin)
    pod = plugin["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != shared["name"]]
    container(plugin)["volumeMounts"].remove(shared)
    assert plugin == plugin_daemonset(render())


def test_the_dra_container_runs_as_rendered(render: Callable[..., Rendered], tmp_path: Path) -> None:
    """The DRA container's command and env, rendered with the node's directories as host paths, run
    against the config-manager's pick from the rendered ConfigMap: it registers with the kubelet, reads
    that file, and serves in the very host directory the device plugin's pod mounts."""
    with dra_cluster(tmp_path) as cluster:
        node = cluster.node
        dra = {
            "enabled": True,
            "kubeletRegistrarDirectoryPath": str(node.registry),
            "kubeletPluginsDirectoryPath": str(node.plugins),
            "cdiRoot": str(node.cdi),
            "metricsAddress": f":{free_port()}",
        }
        config = {"map": ENTRIES, "default": "dra"}
        out = render(
            {"dra": dra, "config": config, "nvml": cluster.nvml, "nvidiaDriverRoot": str(node.driver_root)}
        )
        ctr = dra_daemonset(out)["spec"]["template"]["spec"]["containers"][0]
        (config_map,) = named(out, "ConfigMap").values()
        linked = tmp_path / "config.yaml"  # what the init container links /config/config.yaml to
        linked.write_text(config_map["data"]["dra"])
        # The pod's mounts not at their host path (/config, the driver root at /driver-root) and its
        # service account (in-cluster credentials) are the test's paths and kubeconfig.
        pod = {"KUBECONFIG": str(cluster.api.write_kubeconfig(tmp_path / "kubeconfig"))}
        pod["CONTAINER_DRIVER_ROOT"] = str(node.driver_root)
        env = clean_env(pod)
        for var in ctr["env"]:
            value = (
                var["value"]
                if "value" in var
                else {
                    "spec.nodeName": node.name,
                    "metadata.name": "dra-pod",
                    "metadata.namespace": "gpu-system",
                }[var["valueFrom"]["fieldRef"]["fieldPath"]]
            )
            env[var["name"]] = str(linked) if value == "/config/config.yaml" else value
        (command,) = ctr["command"]
        argv = [*console_script_argv(command), *ctr.get("args", [])]
        cluster.process = Process(argv, tmp_path / "dra.log", env)
        cluster.registered()
        started = re.search(r"starting nvdp dra-kubelet-plugin config=(\{.*\})$", cluster.process.log(), re.M)
        assert started, cluster.process.log()
        assert json.loads(started.group(1))["configFile"] == str(linked)
        shared = volume(plugin_daemonset(out), "dra-plugin-dir")["hostPath"]["path"]
        assert (Path(shared) / "dra.sock").is_socket()
        # the entry gives DRA every GPU; the hand-over record is in the directory the plugin mounts
        wait_until(lambda: len(published(cluster.api)) == 4, 10, "the GPUs published")
        wait_until(lambda: (Path(shared) / "served-by-dra.json").exists(), 10, "the hand-over record")
        # the kubelet's probes, as rendered: the container's `metrics` port, the probes' paths
        (port,) = [
            p["containerPort"] for p in ctr["ports"] if p["name"] == ctr["readinessProbe"]["httpGet"]["port"]
        ]
        wait_until(
            lambda: http_get(port, ctr["readinessProbe"]["httpGet"]["path"]) == (200, "ok\n"), 10, "ready"
        )
        assert http_get(port, ctr["livenessProbe"]["httpGet"]["path"]) == (200, "ok\n")


def test_dra_alone(render: Callable[..., Rendered]) -> None:
    """devicePlugin.enabled=false with dra.enabled: the DRA kubelet plugin and its objects, no device
    plugin (nor its MPS daemon, Service or monitors)."""
    out = render(
        {"devicePlugin": {"enabled": False}, **ENABLED, "config": {"name": "site-configs", "default": "a"}}
    )
    assert [d["metadata"]["name"] for d in out.docs if d["kind"] == "DaemonSet"] == [
        dra_daemonset(out)["metadata"]["name"]
    ]
    assert "Service" not in out.kinds()
    assert set(named(out, "DeviceClass")) == {"gpu.nvidia.com", "mig.nvidia.com"}
    for doc in out.docs:
        check_schema(doc)


def test_env_vars_added_to_the_dra_container(
    render: Callable[..., Rendered], render_error: Callable[..., str]
) -> None:
    env = [
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
    ]
    out = render({"dra": {"enabled": True, "containers": {"gpus": {"env": env}}}})
    (container,) = dra_daemonset(out)["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert names.count("NVIDIA_DRIVER_CAPABILITIES") == 1
    assert names[-2:] == ["NVIDIA_DRIVER_CAPABILITIES", "HTTPS_PROXY"]
    assert container["env"][-2:] == env
    assert "HTTPS_PROXY" not in str(render({}).docs)  # the device plugin's container: not given them
    said = render_error(
        {"dra": {"enabled": True, "containers": {"gpus": {"env": [{"name": "CDI_ROOT", "value": "/x"}]}}}}
    )
    assert "dra.containers.gpus.env: CDI_ROOT is set twice, or also by this chart from its values" in said
    for entry in ({"value": "x"}, "HTTPS_PROXY=p"):
        said = render_error({"dra": {"enabled": True, "containers": {"gpus": {"env": [entry]}}}})
        shown = json.dumps(entry, separators=(",", ":"))
        assert f"dra.containers.gpus.env: an entry without a name: {shown}" in said


def test_mps_shared_memory_for_claims(render: Callable[..., Rendered]) -> None:
    plain = dra_daemonset(render({"dra": {"enabled": True}}))["spec"]["template"]["spec"]
    assert "initContainers" not in plain
    pod = dra_daemonset(render({"dra": {"enabled": True, "mps": True}}))["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    root = "/var/lib/kubelet/plugins/gpu.nvidia.com/mps"
    assert (init["name"], init["command"]) == ("mps-shm", ["nvdp", "mps-control-daemon", "mount-shm"])
    assert init["env"] == [{"name": "MPS_ROOT", "value": root}]
    propagated = {"name": "dra-mps-root", "mountPath": root, "mountPropagation": "Bidirectional"}
    assert init["volumeMounts"] == [propagated]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["dra-mps-shm"] == "/dev/shm"
    assert {"name": "MPS_ROOT", "value": root} in pod["containers"][0]["env"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert (volumes["dra-mps-root"], volumes["dra-mps-shm"]) == (root, f"{root}/shm")
