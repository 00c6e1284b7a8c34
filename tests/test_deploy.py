"""Deployment artefacts, checked without a cluster: the static manifest, the Helm chart, the Dockerfile.

The chart's templates are rendered when a Helm renderer is available: a `helm` binary on PATH, or
the `helm_python` module (PyPI: helm-python-sdk, Helm's Go SDK behind a C ABI). Without either,
the rendering tests are skipped with that reason; everything else runs everywhere.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdp.config import PLUGIN_OPTIONS
from nvdp.plugins.ledger.podresources import pod_resources_socket
from nvdp.side.configmanager.selection import select

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "nvidia-device-plugin"
STATIC = ROOT / "deployments" / "static" / "nvidia-device-plugin.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
CONTAINER = "nvidia-device-plugin-ctr"

# Env vars the program reads as settings (flags' env vars), from the package itself.
PROGRAM_ENV = frozenset(env for option in PLUGIN_OPTIONS for env in option.envs)
# Env vars a manifest may set besides those: NODE_NAME is read by nvdp.kube for Node Events;
# POD_NAME and POD_NAMESPACE by nvdp.plugins.uninstall at stop; the NVIDIA_* ones are read by the NVIDIA
# container toolkit when it sets up the container.
OTHER_ENV = frozenset(
    {"NODE_NAME", "POD_NAME", "POD_NAMESPACE"}
    | {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_MONITOR_DEVICES"}
)

Doc = dict[str, Any]


def load_docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def is_hook(doc: Doc) -> bool:
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


def apart_from_uninstall(docs: list[Doc]) -> list[Doc]:
    """`docs` less uninstall-cleanup.yml's Role and RoleBinding (tests of another Role)."""
    return [d for d in docs if (d.get("metadata") or {}).get("name") != UNINSTALL_RBAC]


def only(docs: list[Doc], kind: str) -> Doc:
    found = [doc for doc in docs if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}: {[d.get('kind') for d in docs]}"
    return found[0]


def kinds(docs: list[Doc]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def container(daemonset: Doc) -> Doc:
    containers: list[Doc] = daemonset["spec"]["template"]["spec"]["containers"]
    # The config-manager sidecar runs beside the plugin when a ConfigMap of entries is used.
    assert [c["name"] for c in containers] in ([CONTAINER], [CONTAINER, "nvidia-device-plugin-sidecar"])
    return containers[0]


def container_env(ctr: Doc) -> dict[str, Any]:
    """name -> value (a string) or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


def env_of(daemonset: Doc) -> dict[str, Any]:
    return container_env(container(daemonset))


def without(ctr: Doc, *names: str) -> Doc:
    """The container without its name and the env vars `names`: what two containers that differ only
    there have in common."""
    env = [e for e in ctr.get("env", []) if e["name"] not in names]
    return {k: v for k, v in {**ctr, "env": env}.items() if k != "name"}


def volume(daemonset: Doc, name: str) -> Doc:
    volumes: dict[str, Doc] = {v["name"]: v for v in daemonset["spec"]["template"]["spec"].get("volumes", [])}
    assert name in volumes, f"no volume {name!r}: {sorted(volumes)}"
    return volumes[name]


def mounts_of(daemonset: Doc) -> dict[str, Doc]:
    return {m["name"]: m for m in container(daemonset).get("volumeMounts", [])}


def check_schema(doc: Doc) -> None:
    """Every field of a built-in object is one the Kubernetes API knows: the `kubernetes` client's
    models drop unknown fields when they read an object, so a misspelt or misplaced key makes
    the round trip differ. Objects of other APIs (monitoring.coreos.com) are not checked."""
    group, _, version = doc["apiVersion"].rpartition("/")
    if group not in ("", "apps", "rbac.authorization.k8s.io") or version != "v1":
        return
    from kubernetes.client import ApiClient  # the API's schema, from the client's generated models

    api = ApiClient()
    model = f"V1{doc['kind']}"
    try:
        parsed = api.deserialize(json.dumps(doc), model, "application/json")
    except TypeError:  # older clients: deserialize(response, type) reads response.data

        class Response:
            data = json.dumps(doc)

        parsed = api.deserialize(Response(), model)
    assert api.sanitize_for_serialization(parsed) == doc, f"{doc['kind']}: fields the API does not know"


def check_plugin_daemonset(daemonset: Doc) -> None:
    """What every DaemonSet of the plugin must have, whichever way it was produced."""
    assert daemonset["apiVersion"] == "apps/v1"
    assert daemonset["kind"] == "DaemonSet"
    spec = daemonset["spec"]
    selector = spec["selector"]["matchLabels"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert selector, "an empty selector"
    assert selector.items() <= pod_labels.items(), f"selector {selector} misses pod labels {pod_labels}"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"

    # The kubelet's device-plugin directory, from the host, at the same path.
    kubelet_dir = volume(daemonset, "kubelet-device-plugins-dir")
    assert kubelet_dir["hostPath"]["path"] == KUBELET_DIR
    assert mounts_of(daemonset)["kubelet-device-plugins-dir"]["mountPath"] == KUBELET_DIR
    # Its PodResources API beside it (nvdp.plugins.ledger), read only; no pod fails to start without it.
    pod_resources = volume(daemonset, "kubelet-pod-resources-dir")["hostPath"]
    assert pod_resources == {"path": POD_RESOURCES_DIR, "type": "DirectoryOrCreate"}
    assert mounts_of(daemonset)["kubelet-pod-resources-dir"] == {
        "name": "kubelet-pod-resources-dir",
        "mountPath": POD_RESOURCES_DIR,
        "readOnly": True,
    }
    assert pod_resources_socket(Path(KUBELET_DIR) / "kubelet.sock").parent == Path(POD_RESOURCES_DIR)

    env = env_of(daemonset)
    unknown = set(env) - PROGRAM_ENV - OTHER_ENV
    assert not unknown, f"env vars the program does not read: {sorted(unknown)}"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")

    # Probes on the port that METRICS_ADDRESS listens on.
    ctr = container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    listen_port = int(env["METRICS_ADDRESS"].rpartition(":")[2])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = ctr[probe]["httpGet"]
        assert http["path"] == path
        port = http["port"]
        assert (ports[port] if isinstance(port, str) else port) == listen_port, probe


# ---- static manifest ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def static_docs() -> list[Doc]:
    return load_docs(STATIC.read_text())


def test_static_manifest_is_one_daemonset_with_its_rbac(static_docs: list[Doc]) -> None:
    assert kinds(static_docs) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    for doc in static_docs:
        check_schema(doc)
    daemonset = only(static_docs, "DaemonSet")
    check_plugin_daemonset(daemonset)
    assert daemonset["metadata"]["namespace"] == "kube-system"


def test_static_manifest_keeps_nvidia_names(static_docs: list[Doc]) -> None:
    """kubectl apply over NVIDIA's static manifest must update its DaemonSet (selectors are immutable)."""
    daemonset = only(static_docs, "DaemonSet")
    assert daemonset["metadata"]["name"] == "nvidia-device-plugin-daemonset"
    assert daemonset["spec"]["selector"]["matchLabels"] == {"name": "nvidia-device-plugin-ds"}


def test_static_manifest_least_privilege(static_docs: list[Doc]) -> None:
    security = container(only(static_docs, "DaemonSet"))["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_static_manifest_rbac_binds_the_pods_service_account(static_docs: list[Doc]) -> None:
    daemonset = only(static_docs, "DaemonSet")
    account = only(static_docs, "ServiceAccount")
    binding = only(static_docs, "ClusterRoleBinding")
    role = only(static_docs, "ClusterRole")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    check_event_rules(role)


def check_event_rules(role: Doc) -> None:
    def allowed(group: str, resource: str, verb: str) -> bool:
        return any(
            group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in role["rules"]
        )

    assert allowed("", "events", "create")
    assert allowed("", "nodes", "get")
    # pod events need no access to pods: holders and UIDs come from the kubelet (nvdp.plugins.ledger)
    assert not any("pods" in r["resources"] for r in role["rules"])


def test_static_manifest_schedules_like_nvidias_with_the_charts_tolerations(static_docs: list[Doc]) -> None:
    """No node affinity, as NVIDIA's static manifest (tests/test_static_over_nvidia.py); the chart's
    default affinity keeps its pods to GPU nodes, which NVIDIA's chart does too."""
    pod = only(static_docs, "DaemonSet")["spec"]["template"]["spec"]
    values = chart_values()
    assert "affinity" not in pod and "nodeSelector" not in pod
    assert pod["tolerations"] == values["tolerations"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    ctr = container(only(static_docs, "DaemonSet"))
    assert ctr["livenessProbe"] == values["livenessProbe"]
    assert ctr["readinessProbe"] == values["readinessProbe"]
    # The static manifests name the image nvdp:<appVersion>, a placeholder their header says to replace.
    assert ctr["image"] == f"nvdp:{chart_meta()['appVersion']}"


# ---- values.yaml and Chart.yaml ----------------------------------------------------------------


def chart_values() -> Doc:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def chart_meta() -> Doc:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert isinstance(meta, dict)
    return meta


def lookup(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        assert isinstance(node, Mapping) and key in node, f"values.yaml has no {dotted}"
        node = node[key]
    return node


# The keys of NVIDIA's chart that users carry over when they switch charts.
NVIDIA_KEYS = [
    "image.repository",
    "image.tag",
    "image.pullPolicy",
    "imagePullSecrets",
    "nameOverride",
    "fullnameOverride",
    "namespaceOverride",
    "selectorLabelsOverride",
    "allowDefaultNamespace",
    "migStrategy",
    "failOnInitError",
    "deviceListStrategy",
    "deviceIDStrategy",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "compatWithCPUManager",
    "gdrcopyEnabled",
    "gdsEnabled",
    "mofedEnabled",
    "deviceDiscoveryStrategy",
    "cdi.nvidiaHookPath",
    "cdi.featureFlags",
    "config.name",
    "config.map",
    "config.default",
    "config.fallbackStrategies",
    "runtimeClassName",
    "priorityClassName",
    "podAnnotations",
    "podSecurityContext",
    "securityContext",
    "resources",
    "nodeSelector",
    "affinity",
    "tolerations",
    "updateStrategy",
    "devicePlugin.enableHostNetwork",
]
# Plugin settings: null, so that the config file (or the plugin's default) decides unless set.
UNSET_SETTINGS = [
    "migStrategy",
    "failOnInitError",
    "deviceListStrategy",
    "deviceIDStrategy",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "compatWithCPUManager",
    "gdrcopyEnabled",
    "gdsEnabled",
    "mofedEnabled",
    "deviceDiscoveryStrategy",
    "cdi.nvidiaHookPath",
    "cdi.featureFlags",
    "logFormat",
    "logLevel",
    "nvml",
]


@pytest.mark.parametrize("key", NVIDIA_KEYS)
def test_values_have_nvidia_key(key: str) -> None:
    lookup(chart_values(), key)


@pytest.mark.parametrize("key", UNSET_SETTINGS)
def test_values_leave_plugin_settings_unset(key: str) -> None:
    assert lookup(chart_values(), key) is None


def test_values_defaults() -> None:
    values = chart_values()
    assert values["priorityClassName"] == "system-node-critical"
    assert values["updateStrategy"] == {"type": "RollingUpdate"}
    assert values["config"]["fallbackStrategies"] == ["named", "single"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in values["tolerations"]
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    labels = {e["key"]: e["values"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert labels == {
        "feature.node.kubernetes.io/pci-10de.present": ["true"],
        # NFD with "class" among deviceLabelFields (NVIDIA issue #1213): VGA and 3D controllers
        "feature.node.kubernetes.io/pci-0300_10de.present": ["true"],
        "feature.node.kubernetes.io/pci-0302_10de.present": ["true"],
        "feature.node.kubernetes.io/cpu-model.vendor_id": ["NVIDIA"],
        "nvidia.com/gpu.present": ["true"],
    }
    metrics = values["metrics"]
    assert metrics["enabled"] is True and metrics["port"] == 2112
    assert metrics["serviceMonitor"]["enabled"] is False and metrics["podMonitor"]["enabled"] is False
    assert values["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert values["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert values["rbac"]["create"] is True and values["serviceAccount"]["create"] is True


def test_chart_metadata_matches_the_package() -> None:
    meta = chart_meta()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "nvidia-device-plugin"
    assert meta["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", meta["version"])
    assert meta["appVersion"] == project["version"]


# ---- Dockerfile ---------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends with a continuation line"
    return instructions


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in dockerfile_instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def console_scripts() -> dict[str, str]:
    """pyproject's [project.scripts]: console script -> entry point."""
    scripts: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts


def ci_python_version() -> str:
    """The Python version CI tests with and mypy targets (pyproject.toml); the image must use it too."""
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["python_version"]
    return version


def test_dockerfile_is_multi_stage_on_python_slim() -> None:
    args = {}
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2
    assert re.search(r"\bAS\s+build\b", build[0][1], re.IGNORECASE)
    for stage in (build, final):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stage[0][1].split()[0])
        assert image == f"python:{ci_python_version()}-slim"


def test_dockerfile_final_stage_installs_only_the_built_wheels() -> None:
    final = stages()[-1]
    runs = " ".join(rest for word, rest in final if word == "RUN")
    assert "pip install" in runs and "--no-cache-dir" in runs and "--no-index" in runs
    assert "from=build" in runs
    assert not re.search(r"apt-get|gcc|build-essential", runs), "no compilers in the final image"
    assert not [rest for word, rest in final if word == "COPY" and "--from" not in rest], (
        "the final stage copies nothing from the build context"
    )


def test_dockerfile_entrypoint_and_env() -> None:
    final = stages()[-1]
    entrypoints = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    entrypoint = json.loads(entrypoints[0])
    assert entrypoint == ["nvidia-device-plugin"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[0] in scripts
    env: dict[str, str] = {}
    for word, rest in final:
        if word == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")


# NVIDIA's binaries, where its images hold them and its manifests name them, and the entry point of
# nvdp's console script each runs (NVIDIA/k8s-device-plugin v0.20.0 deployments/container/Dockerfile;
# NVIDIA/k8s-dra-driver-gpu deployments/container/Dockerfile for gpu-kubelet-plugin).
NVIDIA_BINARIES = {
    "/usr/bin/nvidia-device-plugin": "nvdp.cli:plugin_main",
    "/usr/bin/gpu-feature-discovery": "nvdp.cli:gfd_main",
    "/usr/bin/config-manager": "nvdp.cli:config_manager_main",
    "/usr/bin/mps-control-daemon": "nvdp.cli:mps_control_daemon_main",
    "/usr/bin/gpu-kubelet-plugin": "nvdp.cli:dra_kubelet_plugin_main",
}
# Where pip puts console scripts in the python image (its prefix is /usr/local).
SCRIPTS_DIR = "/usr/local/bin"


def final_stage_commands() -> list[list[str]]:
    """Each shell command of the final stage's RUN instructions (split at `&&` and `;`), as words."""
    commands = []
    for word, rest in stages()[-1]:
        if word == "RUN":
            for command in re.split(r"&&|;", rest):
                if command.strip():
                    commands.append(shlex.split(command))
    return commands


def dockerfile_links() -> dict[str, str]:
    """link -> target of each `ln -s TARGET LINK` the final stage runs."""
    links = {}
    for command in final_stage_commands():
        if command[:2] == ["ln", "-s"]:
            assert len(command) == 4, f"one link per ln: {command}"
            links[command[3]] = command[2]
    return links


@pytest.mark.parametrize(
    "path, entry", NVIDIA_BINARIES.items(), ids=[p.rpartition("/")[2] for p in NVIDIA_BINARIES]
)
def test_image_answers_to_nvidias_binary_path(path: str, entry: str) -> None:
    """NVIDIA's manifests run `/usr/bin/gpu-feature-discovery` and signal `/usr/bin/mps-control-daemon`:
    the path is a link to nvdp's console script of the same name, which runs the same command."""
    name = path.rpartition("/")[2]
    assert dockerfile_links().get(path) == f"{SCRIPTS_DIR}/{name}"
    assert console_scripts()[name] == entry


def test_every_console_script_is_linked_from_usr_bin_and_run_at_build() -> None:
    scripts = console_scripts()
    assert dockerfile_links() == {f"/usr/bin/{name}": f"{SCRIPTS_DIR}/{name}" for name in scripts}
    commands = final_stage_commands()
    ran = [command[0] for command in commands if command[1:] == ["--version"]]
    for link in dockerfile_links():
        assert link in ran, f"the build does not run {link}: a link that leads nowhere would pass"
        made = next(i for i, c in enumerate(commands) if c[:2] == ["ln", "-s"] and c[3] == link)
        assert made < next(i for i, c in enumerate(commands) if c == [link, "--version"])


def test_dockerfile_copies_what_the_context_keeps() -> None:
    ignore = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", ".dockerignore is an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for word, rest in dockerfile_instructions():
        if word == "COPY" and "--from" not in rest:
            *sources, _ = rest.split()
            for source in sources:
                assert source in allowed, f"COPY {source}: excluded by .dockerignore"
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"


# ---- the chart, rendered ------------------------------------------------------------------------

RELEASE = "nvdp"
# uninstall-cleanup.yml's Role and RoleBinding: the pods' read of their own DaemonSet at stop.
UNINSTALL_RBAC = f"{RELEASE}-nvidia-device-plugin-uninstall"
NAMESPACE = "gpu-system"


class RenderError(Exception):
    pass


Renderer = Callable[[Mapping[str, Any], str, tuple[str, ...]], dict[str, str]]

# The image every render uses unless the values name one: the chart requires image.repository.
TEST_IMAGE = "registry.example/nvdp"


def with_test_image(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with image.repository set to TEST_IMAGE where they do not set it."""
    image = dict(values.get("image") or {})
    image.setdefault("repository", TEST_IMAGE)
    return {**values, "image": image}


def _helm_binary(helm: str) -> Renderer:
    def render(values: Mapping[str, Any], namespace: str, api_versions: tuple[str, ...]) -> dict[str, str]:
        command = [helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--values", "-"]
        command += [f"--api-versions={version}" for version in api_versions]
        done = subprocess.run(
            command, input=json.dumps(with_test_image(values)), capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RenderError(done.stderr)
        manifests: dict[str, str] = {}
        for chunk in re.split(r"^---\s*$", done.stdout, flags=re.MULTILINE):
            source = re.search(r"^# Source: (\S+)", chunk, flags=re.MULTILINE)
            if source:
                manifests[source.group(1)] = manifests.get(source.group(1), "") + "\n---\n" + chunk
        return manifests

    return render


def _helm_sdk() -> Renderer:
    import helm_python  # type: ignore[import-not-found]

    def render(values: Mapping[str, Any], namespace: str, api_versions: tuple[str, ...]) -> dict[str, str]:
        if api_versions:
            pytest.skip("helm_python cannot set the cluster's API versions; a helm binary can")
        with helm_python.Chart.load(str(CHART)) as chart:
            try:
                return dict(
                    chart.render(with_test_image(values), name=RELEASE, namespace=namespace, is_install=True)
                )
            except helm_python.HelmError as error:
                raise RenderError(str(error)) from error

    return render


def _find_renderer() -> tuple[Renderer | None, str]:
    helm = shutil.which("helm")
    if helm:
        return _helm_binary(helm), ""
    try:
        return _helm_sdk(), ""
    except ImportError:
        return None, (
            "no Helm renderer: neither a `helm` binary on PATH nor the helm_python module "
            "(pip install helm-python-sdk)"
        )


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    found, reason = _find_renderer()
    if found is None:
        pytest.skip(reason)
    return found


class Rendered:
    """The release's objects (`docs`) and, apart, its Helm hooks' (`hooks`: made and deleted around
    an install or uninstall, never part of the release)."""

    def __init__(self, manifests: dict[str, str]) -> None:
        self.manifests = manifests
        rendered = [
            doc
            for path, text in sorted(manifests.items())
            if not path.endswith("NOTES.txt")
            for doc in load_docs(text)
        ]
        self.docs = [doc for doc in rendered if not is_hook(doc)]
        self.hooks = [doc for doc in rendered if is_hook(doc)]

    def only(self, kind: str) -> Doc:
        return only(self.docs, kind)

    def kinds(self) -> list[str]:
        return kinds(self.docs)

    @property
    def daemonset(self) -> Doc:
        """The device plugin's DaemonSet (GFD's, the MPS daemon's, the DRA plugin's may be beside it)."""
        found = [
            doc
            for doc in self.docs
            if doc["kind"] == "DaemonSet"
            and CONTAINER in [c["name"] for c in doc["spec"]["template"]["spec"]["containers"]]
        ]
        assert len(found) == 1, f"expected one DaemonSet running {CONTAINER}, found {len(found)}"
        return found[0]

    @property
    def notes(self) -> str:
        for path, text in self.manifests.items():
            if path.endswith("NOTES.txt"):
                return text
        pytest.skip("this renderer does not render NOTES.txt (helm template skips it)")


@pytest.fixture
def render(renderer: Renderer) -> Callable[..., Rendered]:
    def run(
        values: Mapping[str, Any] | None = None,
        *,
        namespace: str = NAMESPACE,
        api_versions: tuple[str, ...] = (),
    ) -> Rendered:
        return Rendered(renderer(values or {}, namespace, api_versions))

    return run


@pytest.fixture
def render_error(renderer: Renderer) -> Callable[..., str]:
    def run(values: Mapping[str, Any], *, namespace: str = NAMESPACE) -> str:
        with pytest.raises(RenderError) as caught:
            renderer(values, namespace, ())
        return str(caught.value)

    return run


def test_chart_defaults(render: Callable[..., Rendered]) -> None:
    out = render()
    assert out.kinds() == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    daemonset = out.daemonset
    check_plugin_daemonset(daemonset)
    assert daemonset["metadata"]["name"] == f"{RELEASE}-nvidia-device-plugin"
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    # NVIDIA's chart selector, so a release moved from that chart keeps its DaemonSet.
    assert daemonset["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "nvidia-device-plugin",
        "app.kubernetes.io/instance": RELEASE,
    }
    # Null settings are not passed: the config file or the plugin's default decides.
    assert set(env_of(daemonset)) == {
        "METRICS_ADDRESS",
        "NODE_NAME",
        "POD_NAME",
        "POD_NAMESPACE",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
    assert env_of(daemonset)["METRICS_ADDRESS"] == ":2112"
    assert container(daemonset)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container(daemonset)["image"] == f"{TEST_IMAGE}:{chart_meta()['appVersion']}"
    assert set(mounts_of(daemonset)) == {"kubelet-device-plugins-dir", "kubelet-pod-resources-dir"}
    for doc in out.docs:
        check_schema(doc)


def test_chart_with_everything_on_is_valid(render: Callable[..., Rendered]) -> None:
    out = render(
        {
            "compatWithCPUManager": True,
            "nvidiaDriverRoot": "/run/nvidia/driver",
            "migStrategy": "mixed",
            "config": {"map": {"default": ENTRY_A, "shared": ENTRY_B}},
            "devicePlugin": {"enableHostNetwork": True},
            "runtimeClassName": "nvidia",
            "imagePullSecrets": [{"name": "regcred"}],
            "podSecurityContext": {"seccompProfile": {"type": "Unconfined"}},
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
            "nodeSelector": {"pool": "gpu"},
            "podAnnotations": {"team": "ml"},
            "serviceAccount": {"annotations": {"a": "b"}},
            "metrics": {
                "port": 9400,
                "service": {"annotations": {"a": "b"}},
                "forceMonitors": True,
                "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "podMonitor": {"enabled": True, "labels": {"release": "prom"}},
            },
        }
    )
    assert out.kinds() == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "PodMonitor",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    check_plugin_daemonset(out.daemonset)
    for doc in out.docs:
        check_schema(doc)


def test_chart_defaults_match_the_static_manifest(
    render: Callable[..., Rendered], static_docs: list[Doc]
) -> None:
    """The static manifest is the chart's default DaemonSet, but for its names and labels, for the
    chart's node affinity (the static manifest schedules as NVIDIA's static manifest does) and for
    the pod's name and namespace (the static manifest has no RBAC to read its DaemonSet at stop)."""
    values = {"image": {"repository": "nvdp"}}  # the static manifests' image
    rendered = render(values, namespace="kube-system").daemonset["spec"]["template"]["spec"]
    static = only(static_docs, "DaemonSet")["spec"]["template"]["spec"]
    for pod in (rendered, static):
        pod.pop("serviceAccountName")
    assert rendered.pop("affinity") == chart_values()["affinity"]
    (ctr,) = rendered["containers"]
    ctr["env"] = [e for e in ctr["env"] if e["name"] not in ("POD_NAME", "POD_NAMESPACE")]
    assert rendered == static


def test_chart_rbac(render: Callable[..., Rendered]) -> None:
    out = render()
    account = out.only("ServiceAccount")
    binding = out.only("ClusterRoleBinding")
    assert out.daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": out.only("ClusterRole")["metadata"]["name"],
    }
    check_event_rules(out.only("ClusterRole"))


def test_chart_without_rbac(render: Callable[..., Rendered]) -> None:
    out = render({"rbac": {"create": False}, "serviceAccount": {"create": False}})
    assert out.kinds() == ["DaemonSet", "Service"]
    assert out.daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "default"


@pytest.mark.parametrize(
    ("values", "env", "expected"),
    [
        pytest.param({"migStrategy": "mixed"}, "MIG_STRATEGY", "mixed", id="migStrategy"),
        pytest.param({"failOnInitError": False}, "FAIL_ON_INIT_ERROR", "false", id="failOnInitError"),
        pytest.param({"compatWithCPUManager": True}, "PASS_DEVICE_SPECS", "true", id="compatWithCPUManager"),
        pytest.param(
            {"deviceListStrategy": "envvar,cdi-annotations"},
            "DEVICE_LIST_STRATEGY",
            "envvar,cdi-annotations",
            id="deviceListStrategy",
        ),
        pytest.param({"deviceIDStrategy": "index"}, "DEVICE_ID_STRATEGY", "index", id="deviceIDStrategy"),
        pytest.param(
            {"nvidiaDriverRoot": "/run/nvidia/driver"},
            "NVIDIA_DRIVER_ROOT",
            "/run/nvidia/driver",
            id="nvidiaDriverRoot",
        ),
        pytest.param({"nvidiaDevRoot": "/"}, "NVIDIA_DEV_ROOT", "/", id="nvidiaDevRoot"),
        pytest.param({"gdsEnabled": True}, "GDS_ENABLED", "true", id="gdsEnabled"),
        pytest.param(
            {"deviceDiscoveryStrategy": "nvml"},
            "DEVICE_DISCOVERY_STRATEGY",
            "nvml",
            id="deviceDiscoveryStrategy",
        ),
        pytest.param(
            {"cdi": {"nvidiaHookPath": "/usr/bin/nvidia-cdi-hook"}},
            "NVIDIA_CDI_HOOK_PATH",
            "/usr/bin/nvidia-cdi-hook",
            id="cdi.nvidiaHookPath",
        ),
        pytest.param({"logFormat": "json"}, "LOG_FORMAT", "json", id="logFormat"),
        pytest.param({"logLevel": "debug"}, "LOG_LEVEL", "debug", id="logLevel"),
        pytest.param({"nvml": "sim:dgx-a100"}, "NVDP_NVML", "sim:dgx-a100", id="nvml"),
        pytest.param({"metrics": {"port": 9400}}, "METRICS_ADDRESS", ":9400", id="metrics.port"),
    ],
)
def test_chart_setting_becomes_env(
    render: Callable[..., Rendered], values: Doc, env: str, expected: str
) -> None:
    daemonset = render(values).daemonset
    check_plugin_daemonset(daemonset)
    assert env_of(daemonset)[env] == expected


def test_chart_driver_root_is_mounted_at_driver_root(render: Callable[..., Rendered]) -> None:
    daemonset = render({"nvidiaDriverRoot": "/run/nvidia/driver"}).daemonset
    assert volume(daemonset, "driver-root")["hostPath"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    assert mounts_of(daemonset)["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
    }


LEAST = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
SYS_ADMIN = {"capabilities": {"add": ["SYS_ADMIN"]}}
MIG_MIXED_ENTRY = "version: v1\nflags:\n  migStrategy: mixed\n"


@pytest.mark.parametrize(
    ("values", "expected", "mig_monitor"),
    [
        pytest.param({}, LEAST, False, id="default"),
        pytest.param({"migStrategy": "none"}, LEAST, False, id="mig-none"),
        pytest.param({"compatWithCPUManager": True}, {"privileged": True}, False, id="compat-cpu-manager"),
        pytest.param({"migStrategy": "single"}, SYS_ADMIN, True, id="mig-single"),
        pytest.param({"deviceListStrategy": "volume-mounts"}, SYS_ADMIN, False, id="volume-mounts"),
        pytest.param(
            {"config": {"map": {"default": MIG_MIXED_ENTRY}}}, SYS_ADMIN, True, id="mig-in-config-entry"
        ),
        pytest.param(
            {"config": {"map": {"default": yaml.safe_load(MIG_MIXED_ENTRY)}}},
            SYS_ADMIN,
            True,
            id="mig-in-config-entry-given-as-mapping",
        ),
        pytest.param(
            {"config": {"map": {"default": MIG_MIXED_ENTRY}}, "migStrategy": "none"},
            LEAST,
            False,
            id="value-overrides-config-entry",
        ),
        # An existing ConfigMap is read with `lookup`, which helm template cannot: it adds nothing.
        pytest.param({"config": {"name": "my-configs", "default": "a"}}, LEAST, False, id="external-config"),
        pytest.param({"securityContext": {"runAsUser": 0}}, {"runAsUser": 0}, False, id="explicit"),
    ],
)
def test_chart_security_context(
    render: Callable[..., Rendered], values: Doc, expected: Doc, mig_monitor: bool
) -> None:
    daemonset = render(values).daemonset
    assert container(daemonset)["securityContext"] == expected
    assert ("NVIDIA_MIG_MONITOR_DEVICES" in env_of(daemonset)) == mig_monitor


# -- config file

ENTRY_A = "version: v1\nflags:\n  migStrategy: none\n"
ENTRY_B = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def config_volume(daemonset: Doc) -> Doc:
    """The ConfigMap volume of the entries (the config-manager links /config/config.yaml to one)."""
    assert env_of(daemonset)["CONFIG_FILE"] == "/config/config.yaml"
    assert mounts_of(daemonset)["config"]["mountPath"] == "/config"
    assert volume(daemonset, "config") == {"name": "config", "emptyDir": {}}
    config_map: Doc = volume(daemonset, "available-configs")["configMap"]
    return config_map


@pytest.mark.parametrize(
    ("config", "entry"),
    [
        pytest.param({"map": {"only": ENTRY_A}}, "only", id="single"),
        pytest.param({"map": {"default": ENTRY_A, "shared": ENTRY_B}}, "default", id="named"),
        pytest.param({"map": {"a": ENTRY_A, "shared": ENTRY_B}, "default": "shared"}, "shared", id="default"),
        pytest.param(
            {"map": {"a": ENTRY_A, "b": ENTRY_B}, "fallbackStrategies": ["named", "single", "empty"]},
            None,
            id="empty-fallback",
        ),
    ],
)
def test_chart_config_map(render: Callable[..., Rendered], config: Doc, entry: str | None) -> None:
    out = render({"config": config})
    config_map = out.only("ConfigMap")
    # Every entry is kept in the ConfigMap; only the chosen one is mounted.
    assert {k: v.strip() for k, v in config_map["data"].items()} == {
        k: v.strip() for k, v in config["map"].items()
    }
    daemonset = out.daemonset
    check_plugin_daemonset(daemonset)
    assert "checksum/config" in daemonset["spec"]["template"]["metadata"]["annotations"]
    assert config_volume(daemonset) == {"name": config_map["metadata"]["name"]}
    (init,) = daemonset["spec"]["template"]["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    fallbacks = [f for f in env["FALLBACK_STRATEGIES"].split(",") if f]
    assert select(None, sorted(config["map"]), env["DEFAULT_CONFIG"], fallbacks) == (entry or "")


def test_chart_config_entry_given_as_mapping(render: Callable[..., Rendered]) -> None:
    entry = yaml.safe_load(ENTRY_B)
    config_map = render({"config": {"map": {"shared": entry}}}).only("ConfigMap")
    assert yaml.safe_load(config_map["data"]["shared"]) == entry


@pytest.mark.parametrize(
    ("config", "entry"),
    [
        pytest.param({"name": "site-configs", "default": "a100"}, "a100", id="default"),
        pytest.param({"name": "site-configs"}, "default", id="named-fallback"),
    ],
)
def test_chart_external_config(render: Callable[..., Rendered], config: Doc, entry: str) -> None:
    out = render({"config": config})
    assert "ConfigMap" not in out.kinds()
    assert config_volume(out.daemonset) == {"name": "site-configs"}
    (init,) = out.daemonset["spec"]["template"]["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    fallbacks = [f for f in env["FALLBACK_STRATEGIES"].split(",") if f]
    assert select(None, ["a100", "default", "other"], env["DEFAULT_CONFIG"], fallbacks) == entry


def test_chart_notes_tell_how_to_switch_a_node(render: Callable[..., Rendered]) -> None:
    notes = render({"config": {"map": {"default": ENTRY_A, "shared": ENTRY_B}}}).notes
    assert "kubectl label node <node> nvidia.com/device-plugin.config=<entry>" in notes
    assert "nvidia.com/device-plugin.config" not in render().notes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"config": {"name": "x", "map": {"a": ENTRY_A}}}, "not both", id="name-and-map"),
        pytest.param({"config": {"map": {"a": ENTRY_A, "b": ENTRY_B}}}, "none is chosen", id="no-default"),
        pytest.param(
            {"config": {"map": {"a": ENTRY_A}, "default": "b"}},
            '"b" is not an entry of config.map',
            id="unknown-default",
        ),
        pytest.param(
            {"config": {"map": {"a": ENTRY_A}, "fallbackStrategies": ["first"]}},
            'unknown strategy "first"',
            id="unknown-fallback",
        ),
        pytest.param(
            {"config": {"name": "x", "fallbackStrategies": ["single"]}},
            "config.default: required",
            id="external-without-default",
        ),
        pytest.param({"migStrategy": "all"}, 'migStrategy: invalid value "all"', id="migStrategy"),
        pytest.param(
            {"deviceListStrategy": "envvar,mounts"},
            'deviceListStrategy: invalid value "mounts"',
            id="deviceListStrategy",
        ),
        pytest.param(
            {"devicePlugin": {"enabled": False}},
            "devicePlugin.enabled: false, and neither gfd.enabled nor dra.enabled is true: nothing to deploy",
            id="devicePlugin-disabled-alone",
        ),
        pytest.param(
            {"devicePlugin": {"enabled": "no"}},
            'devicePlugin.enabled: invalid value "no" (accepted: true, false)',
            id="devicePlugin-enabled-not-bool",
        ),
    ],
)
def test_chart_refuses(render_error: Callable[..., str], values: Doc, message: str) -> None:
    assert message in render_error(values)


def test_chart_refuses_the_default_namespace(
    render: Callable[..., Rendered], render_error: Callable[..., str]
) -> None:
    assert "allowDefaultNamespace" in render_error({}, namespace="default")
    assert render({"allowDefaultNamespace": True}, namespace="default").daemonset


def test_chart_accepts_nvidia_default_values(render: Callable[..., Rendered]) -> None:
    """A values file written for NVIDIA's chart, with its own defaults for what nvdp lacks."""
    nvidia_style = {
        "gfd": {"enabled": False, "nameOverride": "gpu-feature-discovery"},
        "nfd": {"nameOverride": "node-feature-discovery"},
        "mps": {"root": "/run/nvidia/mps"},
        "devicePlugin": {"enabled": True},
        "cdi": {"nvidiaHookPath": None, "featureFlags": None},
        "componentSelectorLabels": {"enabled": False},
        "migStrategy": "single",
        "failOnInitError": True,
        "config": {"map": {"default": ENTRY_A}, "default": "", "fallbackStrategies": ["named", "single"]},
    }
    check_plugin_daemonset(render(nvidia_style).daemonset)


# -- metrics


def test_chart_metrics_disabled(render: Callable[..., Rendered]) -> None:
    out = render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}, "forceMonitors": True}})
    assert out.kinds() == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    ctr = container(out.daemonset)
    assert env_of(out.daemonset)["METRICS_ADDRESS"] == ""
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(ctr)


def test_chart_metrics_service_is_headless_on_the_pods(render: Callable[..., Rendered]) -> None:
    out = render({"metrics": {"port": 9400}})
    service = out.only("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {
        **out.daemonset["spec"]["selector"]["matchLabels"],
        "app.kubernetes.io/component": "device-plugin",
    }
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert container(out.daemonset)["ports"] == [
        {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}
    ]


def test_chart_monitors_need_the_api_or_force(render: Callable[..., Rendered]) -> None:
    enabled = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    assert not {"ServiceMonitor", "PodMonitor"} & set(render({"metrics": enabled}).kinds())
    out = render({"metrics": {**enabled, "forceMonitors": True}})
    check_monitors(out)


def test_chart_monitors_when_the_cluster_serves_the_api(render: Callable[..., Rendered]) -> None:
    enabled = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    check_monitors(render({"metrics": enabled}, api_versions=("monitoring.coreos.com/v1",)))


def check_monitors(out: Rendered) -> None:
    service_monitor = out.only("ServiceMonitor")
    service = out.only("Service")
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in service_monitor["spec"]["endpoints"]] == ["metrics"]
    pod_monitor = out.only("PodMonitor")
    pod_labels = out.daemonset["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    for monitor in (service_monitor, pod_monitor):
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_chart_image_and_overrides(render: Callable[..., Rendered]) -> None:
    out = render(
        {
            "image": {"repository": "registry.example/nvdp", "tag": "dev"},
            "fullnameOverride": "gpu-plugin",
            "priorityClassName": "",
            "runtimeClassName": "nvidia",
            "nodeSelector": {"pool": "gpu"},
            "affinity": None,
            "podAnnotations": {"team": "ml"},
            "resources": {"requests": {"cpu": "50m"}},
        }
    )
    daemonset = out.daemonset
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["name"] == "gpu-plugin"
    assert container(daemonset)["image"] == "registry.example/nvdp:dev"
    assert container(daemonset)["resources"] == {"requests": {"cpu": "50m"}}
    assert "priorityClassName" not in pod and "affinity" not in pod
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"pool": "gpu"}
    assert daemonset["spec"]["template"]["metadata"]["annotations"] == {"team": "ml"}


def test_chart_requires_an_nvdp_image(render_error: Callable[..., str]) -> None:
    """nvdp publishes no image: the chart's default repository is empty, and the install fails saying
    to set it."""
    assert chart_values()["image"]["repository"] == ""
    said = render_error({"image": {"repository": ""}})
    assert (
        "image.repository: not set; nvdp publishes no image: build it with the repository's Dockerfile, "
        "push it, and set image.repository=REGISTRY/nvdp (and image.tag)"
    ) in said


@pytest.mark.parametrize(
    "repository",
    [
        "nvcr.io/nvidia/k8s-device-plugin",
        "nvidia/k8s-device-plugin",
        "mirror.example/nvidia/k8s-device-plugin",
    ],
    ids=["nvcr", "docker-hub", "mirror"],
)
def test_chart_refuses_nvidias_image(render_error: Callable[..., str], repository: str) -> None:
    """NVIDIA's values (and a release of NVIDIA's chart, on `helm upgrade`) carry NVIDIA's image, which
    has none of nvdp's commands, probes or settings."""
    said = render_error({"image": {"repository": repository}})
    assert (
        f"image.repository: \"{repository}\" is NVIDIA's image, which cannot run this chart's pods "
        "(nvdp's commands, probes and settings); set image.repository to your nvdp image"
    ) in said


def test_chart_selector_labels_override(render: Callable[..., Rendered]) -> None:
    """To take over a DaemonSet created with another selector (e.g. NVIDIA's static manifest's)."""
    out = render({"selectorLabelsOverride": {"name": "nvidia-device-plugin-ds"}})
    check_plugin_daemonset(out.daemonset)
    assert out.daemonset["spec"]["selector"]["matchLabels"] == {"name": "nvidia-device-plugin-ds"}
    assert out.only("Service")["spec"]["selector"] == {
        "name": "nvidia-device-plugin-ds",
        "app.kubernetes.io/component": "device-plugin",
    }


def test_chart_host_network(render: Callable[..., Rendered]) -> None:
    pod = render({"devicePlugin": {"enableHostNetwork": True}}).daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostNetwork" not in render().daemonset["spec"]["template"]["spec"]


def test_chart_objects_share_the_namespace_override(render: Callable[..., Rendered]) -> None:
    out = render({"namespaceOverride": "gpu-operator", "config": {"map": {"only": ENTRY_A}}})
    for doc in out.docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "gpu-operator", doc["kind"]
