"""A small HTTP transport to the API server over urllib3, without the `kubernetes` client.

Importing any part of the `kubernetes` package runs its `__init__`, which imports the whole client
(pydantic, requests, oauthlib, websocket...): about 17 MiB of RSS. The common configurations need
none of it, so `light_client` serves them with urllib3 alone:
- a host (+ bearer token) given directly (tests: a local stand-in);
- the in-cluster service account (KUBERNETES_SERVICE_HOST/PORT, its token, re-read every minute as
  the client does, and its CA);
- a kubeconfig whose current context names a cluster (server, certificate-authority(-data),
  insecure-skip-tls-verify) and a user (token or tokenFile; client-certificate + client-key files).
Anything else (an exec or auth-provider user, basic auth, a proxy, a tls-server-name, a file that
does not read as above) gets None: the caller falls back to the `kubernetes` client, whose errors
and auth modes stay what they were.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REFRESH_SECONDS = 60.0  # the client's in-cluster token refresh period
_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
_USER_KEYS = {"token", "tokenFile", "client-certificate", "client-key"}


@dataclass
class LightClient:
    """What a request needs: the server's URL, a bearer token (a fixed one, or a file re-read every
    TOKEN_REFRESH_SECONDS), and the TLS settings of its urllib3 pool."""

    host: str
    token: str = ""
    token_file: str = ""
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    retries: int = 1
    _read_at: float = field(default=-1e9, repr=False)

    def __post_init__(self) -> None:
        import urllib3  # lifts a process's ssl block (nvdp.base.ssl_block)

        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=max(4, os.cpu_count() or 1),
            retries=self.retries,
            cert_reqs="CERT_REQUIRED" if self.verify else "CERT_NONE",
            ca_certs=self.ca_file,
            ca_cert_data=self.ca_data,
            cert_file=self.cert_file,
            key_file=self.key_file,
        )

    def authorization(self) -> str:
        if self.token_file and time.monotonic() - self._read_at >= TOKEN_REFRESH_SECONDS:
            try:
                with open(self.token_file) as file:
                    self.token = file.read().strip() or self.token
            except OSError:  # mid-rotation: the last token until the next read
                pass
            self._read_at = time.monotonic()
        return f"Bearer {self.token}" if self.token else ""

    def send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        timeout: float | tuple[float, float],
        body: object,
        headers: Mapping[str, str],
    ) -> Any:
        """The urllib3 response, its body unread (any status)."""
        import urllib3

        url = self.host + path + (f"?{urlencode(query)}" if query else "")
        sent = dict(headers)
        if authorization := self.authorization():
            sent["Authorization"] = authorization
        if body is not None and not isinstance(body, bytes | str):
            body = json.dumps(body)
        if isinstance(timeout, tuple):  # (connect, read), as the client takes it
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        return self.pool.request(method, url, body=body, headers=sent, timeout=limit, preload_content=False)


def light_client(
    *,
    kubeconfig: str | None,
    retries: int,
    environ: Mapping[str, str] = os.environ,
    account_dir: str = SERVICE_ACCOUNT_DIR,
) -> LightClient | None:
    """A LightClient for the kubeconfig at `kubeconfig` (else the in-cluster service account in
    `account_dir`), or None where only the `kubernetes` client can serve (see the module)."""
    if any(k.lower().endswith("_proxy") and k.lower() != "no_proxy" and v for k, v in environ.items()):
        return None  # the client takes its proxy from the environment
    try:
        if kubeconfig:
            return _from_kubeconfig(kubeconfig, retries)
        return _in_cluster(environ, account_dir, retries)
    except Exception:  # the `kubernetes` client reads it and says what is wrong, as before
        return None


def _in_cluster(environ: Mapping[str, str], account_dir: str, retries: int) -> LightClient | None:
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    token, ca = os.path.join(account_dir, "token"), os.path.join(account_dir, "ca.crt")
    if not (host and port and _has_content(token) and _has_content(ca)):
        return None
    host = f"[{host}]" if ":" in host or "%" in host else host
    return LightClient(f"https://{host}:{port}", token_file=token, ca_file=ca, retries=retries)


def _from_kubeconfig(path: str, retries: int) -> LightClient | None:
    from nvdp.base.bounded import loads_yaml
    from nvdp.base.files import read_bounded

    config = loads_yaml(read_bounded(path))
    context = _named(config, "contexts", config["current-context"])
    cluster = _named(config, "clusters", context["cluster"])
    user = _named(config, "users", context["user"]) if context.get("user") else {}
    if (
        not set(cluster) <= _CLUSTER_KEYS
        or not set(user) <= _USER_KEYS
        or {"token", "tokenFile"} <= set(user)
    ):
        return None
    if ("client-certificate" in user) != ("client-key" in user):
        return None
    base = os.path.dirname(os.path.abspath(path))

    def file(entry: dict[str, Any], key: str) -> str | None:
        return os.path.join(base, str(entry[key])) if entry.get(key) else None

    host = str(cluster["server"]).rstrip("/")
    if "tokenFile" in user:
        with open(file(user, "tokenFile") or "") as token_file:
            token = token_file.read().strip()
    else:
        token = str(user.get("token") or "")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        return None
    if not host.startswith("https"):  # the client, too, reads no certificate for a plain server
        return LightClient(host, token=token, verify=not insecure, retries=retries)
    data = cluster.get("certificate-authority-data")
    return LightClient(
        host,
        token=token,
        ca_data=base64.b64decode(data).decode() if data else None,
        ca_file=None if data else file(cluster, "certificate-authority"),
        cert_file=file(user, "client-certificate"),
        key_file=file(user, "client-key"),
        verify=not insecure,
        retries=retries,
    )


def _named(config: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    for entry in config[section]:
        if entry["name"] == name:
            found = entry[section[:-1]]
            if found is not None and not isinstance(found, dict):
                raise TypeError(f"{section} {name}")
            return found or {}
    raise KeyError(name)


def _has_content(path: str) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) > 0


def lines(response: Any) -> Iterator[str]:
    """A streamed response's complete lines, decoded (bad UTF-8 replaced), as they arrive; bytes
    after the last newline are dropped, as the client's watch drops them."""
    pending = bytearray()
    for chunk in response.stream(amt=None, decode_content=False):
        pending.extend(chunk)
        end = pending.find(b"\n")
        while end != -1:
            yield pending[:end].decode("utf-8", "replace")
            del pending[: end + 1]
            end = pending.find(b"\n")
