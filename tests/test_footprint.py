"""The plugin process stays small: no ssl, no kubernetes client, unless a feature needs them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from testkit import REPO


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_plugin_imports_leave_ssl_and_kubernetes_out() -> None:
    out = run_python(
        """
        import sys
        from nvdp.base.ssl_block import block_ssl
        block_ssl()
        import grpc, nvdp.plugins.deviceplugin.daemon, nvdp.cli, nvdp.node.nvml.sim, http.server
        print("ssl" if sys.modules.get("ssl") is not None else "-", "kubernetes" in sys.modules)
        """
    )
    assert out.split() == ["-", "False"]


def test_importing_a_tls_client_lifts_the_block() -> None:
    """The plugin's entry point is the only caller: the `kubernetes` client gets TLS by being imported."""
    out = run_python(
        """
        import sys
        from nvdp.base.ssl_block import block_ssl
        block_ssl()
        import grpc, http.client
        assert sys.modules.get("ssl") is None and not hasattr(http.client, "HTTPSConnection")
        import kubernetes.client
        import ssl
        assert http.client.HTTPSConnection
        print(ssl.OPENSSL_VERSION.split()[0], kubernetes.client.Configuration().verify_ssl)
        """
    )
    assert out.split() == ["OpenSSL", "True"]


# Loaded by a plugin start only for a feature the start below does not use: Node events (a node name),
# a node file (yaml), a fabric (uuid), MPS, CDI, a file written (tempfile), musl (ctypes.util).
ON_DEMAND = (
    "yaml",
    "uuid",
    "tempfile",
    "importlib.abc",
    "ctypes.util",
    "nvdp.kube",
    "nvdp.node.health.event_sender",
    "nvdp.node.health.node_events",
    "nvdp.node.health.pod_events",
    "nvdp.node.health.node_condition",
    "nvdp.node.mps",
    "nvdp.node.cdi.scan",
)


def test_plugin_start_loads_no_module_of_a_feature_it_does_not_use(tmp_path: Path) -> None:
    """The CPU a plugin uses until it serves is mostly imports (docs/benchmarks.md): a built-in
    simulated node without a node name, a config file, MPS or CDI builds its daemon without them."""
    out = run_python(
        f"""
        import sys
        from nvdp.base.ssl_block import block_ssl
        block_ssl()
        from nvdp.cli import build_parser
        from nvdp.config import resolve
        from nvdp.plugins.deviceplugin.daemon import Daemon
        parser, _ = build_parser("plugin")
        args = parser.parse_args(
            ["plugin", "--nvml", "sim:dgx-a100", "--kubelet-socket", "{tmp_path}/kubelet.sock"]
        )
        Daemon(resolve(args, {{}}), reload_config=lambda: resolve(args, {{}}), environ={{}})
        print(*[m for m in {ON_DEMAND!r} if m in sys.modules] or ["none"])
        """
    )
    assert out.split() == ["none"]


def test_importing_the_kube_package_loads_no_http_client() -> None:
    """urllib3 (and, for the configurations nvdp.kube.transport cannot serve, `kubernetes`) come
    with the first API client built, not with the import."""
    out = run_python(
        """
        import sys
        import nvdp.kube, nvdp.kube.transport
        print(*[m for m in ("urllib3", "kubernetes", "ssl", "yaml") if m in sys.modules] or ["none"])
        """
    )
    assert out.split() == ["none"]
