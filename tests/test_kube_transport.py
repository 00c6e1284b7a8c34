"""nvdp.kube's own transport (nvdp/kube/transport.py): the in-cluster service account and plain
kubeconfigs are served over urllib3 without the `kubernetes` client (about 17 MiB of RSS), over real
TLS (a CA, a server and a client certificate made by `openssl`); every other configuration falls
back to the client."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nvdp.base.errors import KubeError
from nvdp.kube import get_json, new_api_client, transport
from nvdp.kube.transport import LightClient, light_client
from tests.test_footprint import run_python

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
PATH = "/api/v1/namespaces/ns/pods"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _signed(cwd: Path, name: str, subject: str, extensions: str) -> None:
    """`name`.crt and `name`.key, signed by ca.crt."""
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl("req", *NEW_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    signing = (
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        f"{name}.ext",
    )
    _openssl("x509", "-req", "-in", f"{name}.csr", *signing, "-out", f"{name}.crt", cwd=cwd)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, server.crt (127.0.0.1) and client.crt (CN nvdp-client), each with its key; other-ca.crt
    signs none of them."""
    cwd = tmp_path_factory.mktemp("certs")
    for ca in ("ca", "other-ca"):
        out = ("-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "1", "-subj", f"/CN={ca}")
        _openssl("req", "-x509", *NEW_KEY, *out, cwd=cwd)
    _signed(cwd, "server", "/CN=server", "subjectAltName=IP:127.0.0.1")
    _signed(cwd, "client", "/CN=nvdp-client", "extendedKeyUsage=clientAuth")
    return cwd


class TlsServer:
    """An HTTPS server on 127.0.0.1 answering every GET with an empty list; it records each request's
    path, Authorization header and client certificate CN."""

    def __init__(self, certs: Path) -> None:
        self.seen: list[tuple[str, str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                cert: Any = self.connection.getpeercert()  # type: ignore[attr-defined]
                subject = dict(pair[0] for pair in cert["subject"]) if cert else {}
                server.seen.append(
                    (self.path, self.headers.get("Authorization", ""), subject.get("commonName", ""))
                )
                body = json.dumps({"items": [], "metadata": {"resourceVersion": "7"}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs / "server.crt", certs / "server.key")
        context.load_verify_locations(certs / "ca.crt")
        context.verify_mode = ssl.CERT_OPTIONAL
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.http.socket = context.wrap_socket(self.http.socket, server_side=True)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server(certs: Path) -> Iterator[TlsServer]:
    tls = TlsServer(certs)
    yield tls
    tls.http.shutdown()
    tls.http.server_close()


def _account(tmp_path: Path, certs: Path, token: str = "account-token") -> Path:
    account = tmp_path / "serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(token + "\n")
    shutil.copy(certs / "ca.crt", account / "ca.crt")
    return account


def _in_cluster(server: TlsServer, account: Path) -> LightClient | None:
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    return light_client(kubeconfig=None, retries=0, environ=environ, account_dir=str(account))


def _kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def test_in_cluster_account_speaks_verified_tls_with_its_token(
    tmp_path: Path, certs: Path, server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = _account(tmp_path, certs)
    client = _in_cluster(server, account)
    assert client is not None
    assert get_json(client, PATH, {"limit": "5"}, timeout=10)["metadata"] == {"resourceVersion": "7"}
    monkeypatch.setattr(
        transport, "TOKEN_REFRESH_SECONDS", 0.0
    )  # the token is re-read (a minute in production)
    (account / "token").write_text("rotated-token")
    get_json(client, PATH, {}, timeout=10)
    assert server.seen == [
        (f"{PATH}?limit=5", "Bearer account-token", ""),
        (PATH, "Bearer rotated-token", ""),
    ]


def test_in_cluster_host_of_ipv6_is_bracketed(tmp_path: Path, certs: Path) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    client = light_client(
        kubeconfig=None, retries=0, environ=environ, account_dir=str(_account(tmp_path, certs))
    )
    assert client is not None and client.host == "https://[fd00::1]:443"


def test_a_server_the_ca_did_not_sign_is_refused(tmp_path: Path, certs: Path, server: TlsServer) -> None:
    account = _account(tmp_path, certs)
    shutil.copy(certs / "other-ca.crt", account / "ca.crt")
    client = _in_cluster(server, account)
    assert client is not None
    with pytest.raises(KubeError) as raised:
        get_json(client, PATH, {}, timeout=10)
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value) and "\n" not in str(raised.value)
    assert server.seen == []


def test_kubeconfig_client_certificate_and_ca_data(tmp_path: Path, certs: Path, server: TlsServer) -> None:
    import base64

    for name in (
        "client.crt",
        "client.key",
    ):  # relative to the kubeconfig's directory, as the client reads them
        shutil.copy(certs / name, tmp_path / name)
    cluster = {
        "server": f"https://127.0.0.1:{server.port}/",
        "certificate-authority-data": base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
    }
    path = _kubeconfig(tmp_path, cluster, {"client-certificate": "client.crt", "client-key": "client.key"})
    client = new_api_client(kubeconfig=path)
    assert isinstance(client, LightClient)
    get_json(client, PATH, {}, timeout=10)
    assert server.seen == [(PATH, "", "nvdp-client")]


def test_kubeconfig_token_file_and_ca_file(tmp_path: Path, certs: Path, server: TlsServer) -> None:
    (tmp_path / "token").write_text("file-token\n")
    cluster = {"server": f"https://127.0.0.1:{server.port}", "certificate-authority": str(certs / "ca.crt")}
    get_json(new_api_client(kubeconfig=_kubeconfig(tmp_path, cluster, {"tokenFile": "token"})), PATH, {}, 10)
    assert server.seen == [(PATH, "Bearer file-token", "")]


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_kubeconfig_insecure_skip_tls_verify(tmp_path: Path, server: TlsServer) -> None:
    cluster = {"server": f"https://127.0.0.1:{server.port}", "insecure-skip-tls-verify": True}
    get_json(new_api_client(kubeconfig=_kubeconfig(tmp_path, cluster, {"token": "t"})), PATH, {}, 10)
    assert server.seen == [(PATH, "Bearer t", "")]


@pytest.mark.parametrize(
    ("cluster", "user", "environ"),
    [
        ({}, {"exec": {"command": "get-token", "apiVersion": "client.authentication.k8s.io/v1"}}, {}),
        ({}, {"username": "u", "password": "p"}, {}),
        ({"proxy-url": "http://proxy:3128"}, {"token": "t"}, {}),
        ({"tls-server-name": "api"}, {"token": "t"}, {}),
        ({}, {"token": "t"}, {"HTTPS_PROXY": "http://proxy:3128"}),
    ],
    ids=["exec", "basic", "proxy-url", "tls-server-name", "proxy-env"],
)
def test_other_configurations_fall_back_to_the_kubernetes_client(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], environ: dict[str, str]
) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://127.0.0.1:6443", **cluster}, user)
    assert light_client(kubeconfig=path, retries=0, environ=environ) is None
    if not environ:
        assert type(new_api_client(kubeconfig=path)).__name__ == "ApiClient"


def test_requests_and_watches_of_a_plain_kubeconfig_leave_the_kubernetes_package_out() -> None:
    """The DRA plugin's and the config-manager's calls: a list, a write and a watch."""
    out = run_python(
        """
        import sys, tempfile
        from pathlib import Path
        from nvdp.kube import get_json, new_api_client, watch
        from nvdp.kube.client import request
        from testkit.kube_api_standin import KubeApiStandin
        with KubeApiStandin() as api, tempfile.TemporaryDirectory() as tmp:
            client = new_api_client(kubeconfig=str(api.write_kubeconfig(Path(tmp) / "kubeconfig")))
            path = "/api/v1/namespaces/ns/configmaps"
            request(client, "POST", path, {}, 10, {"metadata": {"name": "a", "namespace": "ns"}, "data": {}})
            version = get_json(client, path, {}, 10)["metadata"]["resourceVersion"]
            events = watch(client, path, {"watch": "true", "resourceVersion": "0"}, silence=10)
            print(next(events)["type"], "kubernetes" in sys.modules, "pydantic" in sys.modules)
            events.close()
        """
    )
    assert out.split() == ["ADDED", "False", "False"]


def test_a_token_missing_mid_rotation_leaves_the_last_one(
    tmp_path: Path, certs: Path, server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = _account(tmp_path, certs)
    client = _in_cluster(server, account)
    assert client is not None
    get_json(client, PATH, {}, timeout=10)
    monkeypatch.setattr(transport, "TOKEN_REFRESH_SECONDS", 0.0)
    (account / "token").unlink()
    get_json(client, PATH, {}, timeout=10)
    assert [auth for _, auth, _ in server.seen] == ["Bearer account-token"] * 2
