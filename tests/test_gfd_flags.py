"""NVIDIA gpu-feature-discovery flags that `nvdp gfd` shares with the plugin or reads for the Node
Feature API: --kubeconfig, --driver-root-ctr-path, the USE_NODE_FEATURE_API alias and
--resource-name-prefix. Each is applied (the client, the NVML library roots), with the precedence
flag > env > config file > default and one line per bad value."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from nvdp.base.errors import ConfigError
from nvdp.config.model import DEFAULT_CONTAINER_DRIVER_ROOT
from nvdp.node.nvml import open_nvml
from nvdp.node.nvml.types import Nvml
from nvdp.side.gfd import run as gfd_run
from nvdp.side.gfd.options import GfdSettings, add_gfd_flags, resolve_gfd
from nvdp.side.gfd.output import NodeFeatureOutput
from tests.kube_api_nodefeature import KubeApi

REPO = Path(__file__).resolve().parent.parent


def parse(
    *argv: str, environ: Mapping[str, str] | None = None, token_dir: str = "/nonexistent"
) -> GfdSettings:
    parser = argparse.ArgumentParser()
    add_gfd_flags(parser)
    return resolve_gfd(parser.parse_args(argv), environ or {}, token_dir=token_dir)


# ---- --kubeconfig / KUBECONFIG -----------------------------------------------------------------


def test_kubeconfig_flag_beats_env() -> None:
    assert parse().kubeconfig == ""
    assert parse(environ={"KUBECONFIG": "/env/kc"}).kubeconfig == "/env/kc"
    assert parse("--kubeconfig", "/flag/kc", environ={"KUBECONFIG": "/env/kc"}).kubeconfig == "/flag/kc"


def test_kubeconfig_flag_is_what_the_node_feature_client_uses(tmp_path: Path) -> None:
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        settings = parse(
            "--use-node-feature-api", "--node-name", "n1", "--namespace", "ns",
            "--kubeconfig", str(kubeconfig),
            environ={"KUBECONFIG": str(tmp_path / "missing")},
        )  # fmt: skip
        output = gfd_run.default_output(settings, lambda _: False)
        assert isinstance(output, NodeFeatureOutput)
        assert output.write({"nvidia.com/gpu.count": "1"}) is True
        stored = api.get("/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/ns/nodefeatures/nvidia-features-for-n1")
        assert stored is not None and stored["spec"]["labels"] == {"nvidia.com/gpu.count": "1"}


def test_kube_api_qps_and_burst_are_validated() -> None:
    assert (parse().kube_api_qps, parse().kube_api_burst) == (5.0, 10)
    settings = parse("--kube-api-qps", "2.5", environ={"KUBE_API_QPS": "9", "KUBE_API_BURST": "3"})
    assert (settings.kube_api_qps, settings.kube_api_burst) == (2.5, 3)
    with pytest.raises(ConfigError) as raised:
        parse("--kube-api-qps", "fast", environ={"KUBE_API_BURST": "-1"})
    assert raised.value.problems == [
        '--kube-api-qps / KUBE_API_QPS: must be a number >= 0, got "fast"',
        '--kube-api-burst / KUBE_API_BURST: must be an integer >= 0, got "-1"',
    ]


# ---- --use-node-feature-api: GFD_USE_NODE_FEATURE_API, then USE_NODE_FEATURE_API --------------


def test_use_node_feature_api_env_alias() -> None:
    node = {"NODE_NAME": "n1", "KUBERNETES_NAMESPACE": "ns"}
    assert parse(environ={**node, "USE_NODE_FEATURE_API": "true"}).use_node_feature_api is True
    both = {**node, "GFD_USE_NODE_FEATURE_API": "false", "USE_NODE_FEATURE_API": "true"}
    assert parse(environ=both).use_node_feature_api is False
    assert parse(
        "--use-node-feature-api", environ={**node, "USE_NODE_FEATURE_API": "false"}
    ).use_node_feature_api


def test_use_node_feature_api_alias_beats_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  useNodeFeatureAPI: true\n")
    settings = parse("--config-file", str(config), environ={"USE_NODE_FEATURE_API": "false"})
    assert settings.use_node_feature_api is False


def test_bad_use_node_feature_api_alias_names_the_alias() -> None:
    with pytest.raises(ConfigError) as raised:
        parse(environ={"USE_NODE_FEATURE_API": "maybe"})
    assert raised.value.problems == [
        '--use-node-feature-api / USE_NODE_FEATURE_API: invalid value "maybe" (accepted: true, false, 1, 0)'
    ]


def test_namespace_env_alias() -> None:
    assert parse(environ={"NAMESPACE": "ns2", "POD_NAMESPACE": "pod-ns"}).namespace == "ns2"
    both = {"KUBERNETES_NAMESPACE": "ns1", "NAMESPACE": "ns2"}
    assert parse(environ=both).namespace == "ns1"
    assert parse("--namespace", "flag-ns", environ=both).namespace == "flag-ns"


# ---- --driver-root-ctr-path / --container-driver-root --------------------------------------------


def test_container_driver_root_precedence(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  plugin:\n    containerDriverRoot: /from/file\n")

    def root(*argv: str, environ: Mapping[str, str] | None = None) -> str:
        return parse(*argv, environ=environ).config.flags.plugin.container_driver_root

    assert root() == DEFAULT_CONTAINER_DRIVER_ROOT == "/driver-root"
    assert root("--config-file", str(config)) == "/from/file"
    assert root("--config-file", str(config), environ={"CONTAINER_DRIVER_ROOT": "/env2"}) == "/env2"
    env = {"DRIVER_ROOT_CTR_PATH": "/env1", "CONTAINER_DRIVER_ROOT": "/env2"}
    assert root("--config-file", str(config), environ=env) == "/env1"
    assert root("--container-driver-root", "/flag", environ=env) == "/flag"
    assert root("--driver-root-ctr-path", "/flag", environ=env) == "/flag"


def test_container_driver_root_is_passed_to_open_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    def recording_open_nvml(
        spec: str, driver_root: str | None = None, container_driver_root: str | None = None
    ) -> Nvml:
        seen.append((spec, driver_root, container_driver_root))
        return open_nvml("sim:pcie-4")

    monkeypatch.setattr(gfd_run, "open_nvml", recording_open_nvml)
    settings = parse("--nvidia-driver-root", "/host", "--driver-root-ctr-path", "/ctr")
    gfd_run._open_nvml(settings)
    assert seen == [("real", "/host", "/ctr")]


def test_container_driver_root_is_where_the_nvml_library_is_looked_for(tmp_path: Path) -> None:
    ctr = tmp_path / "ctr"
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "real", "--oneshot", "-o", "",
         "--driver-root-ctr-path", str(ctr), "--machine-type-file", ""],
        env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"tried {ctr}/usr/lib64/libnvidia-ml.so.1, " in result.stderr
    assert "Traceback" not in result.stderr


# ---- --resource-name-prefix / RESOURCE_NAME_PREFIX (the plugin's validation) ---------------------


def test_resource_name_prefix_default_is_accepted() -> None:
    assert parse("--resource-name-prefix", "nvidia.com").runtime.resource_name_prefix == "nvidia.com"
    assert parse(environ={"RESOURCE_NAME_PREFIX": "nvidia.com"}).runtime.resource_name_prefix == "nvidia.com"


def test_other_resource_name_prefix_is_one_line_exit_1() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nvdp.cli", "gfd", "--nvml", "sim:pcie-4", "--oneshot", "-o", "",
         "--resource-name-prefix", "example.com"],
        env={"PATH": "/usr/bin:/bin"}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        'error: --resource-name-prefix / RESOURCE_NAME_PREFIX: "example.com" is not supported by nvdp '
        "(only nvidia.com)\n"
    )


def test_help_lists_the_new_flags() -> None:
    parser = argparse.ArgumentParser()
    add_gfd_flags(parser)
    text = " ".join(parser.format_help().split())
    for name in (
        "--kubeconfig",
        "--driver-root-ctr-path",
        "--container-driver-root",
        "--resource-name-prefix",
    ):
        assert name in text
    assert "GFD_USE_NODE_FEATURE_API, USE_NODE_FEATURE_API" in text


# ---- the plugin's rules that gfd does not need ------------------------------------------------


def test_gfd_needs_no_mps_root(tmp_path: Path) -> None:
    """gfd only describes the node: the settings only the running plugin uses are not asked of it;
    the plugin, given the same, still refuses them (an empty kubelet socket it accepts: it then serves
    without registering)."""
    from nvdp.config import add_plugin_flags, resolve

    config = tmp_path / "mps.yaml"
    config.write_text("version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n")
    environ = {"KUBELET_SOCKET": ""}
    settings = parse("--config-file", str(config), environ=environ)
    assert settings.config.sharing.strategy == "mps" and settings.config.flags.mps_root is None
    parser = argparse.ArgumentParser()
    add_plugin_flags(parser)
    with pytest.raises(ConfigError) as refused:
        resolve(parser.parse_args(["--config-file", str(config)]), environ)
    assert refused.value.problems == [
        "sharing.mps: MPS sharing needs an MPS root (--mps-root / MPS_ROOT / flags.mpsRoot)",
    ]


def test_gfd_node_events_need_a_node_name_and_an_api_server(tmp_path: Path) -> None:
    """Through a kubeconfig here (in-cluster credentials: tests/test_health_node_events.py)."""
    from nvdp.node.health.node_events import NodeEventRecorder

    kubeconfig = str(tmp_path / "kubeconfig")
    assert gfd_run.default_events(parse(environ={"KUBECONFIG": kubeconfig}), {}) is None  # no node name
    assert gfd_run.default_events(parse(environ={"NODE_NAME": "n1"}), {}) is None  # no API server
    for settings in (
        parse(environ={"NODE_NAME": "n1", "KUBECONFIG": kubeconfig}),
        parse("--node-name", "n1", "--kubeconfig", kubeconfig),
    ):
        recorder = gfd_run.default_events(settings, {})
        assert isinstance(recorder, NodeEventRecorder)
        recorder.close()
