"""The plugin process stays small: no ssl, no kubernetes client, unless a feature needs them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from nvdp.testing import REPO


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
        from nvdp.ssl_block import block_ssl
        block_ssl()
        import grpc, nvdp.daemon, nvdp.cli, nvdp.nvml.sim, http.server
        print("ssl" if sys.modules.get("ssl") is not None else "-", "kubernetes" in sys.modules)
        """
    )
    assert out.split() == ["-", "False"]


def test_importing_a_tls_client_lifts_the_block() -> None:
    """The plugin's entry point is the only caller: the `kubernetes` client gets TLS by being imported."""
    out = run_python(
        """
        import sys
        from nvdp.ssl_block import block_ssl
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
