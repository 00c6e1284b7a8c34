"""The Kubernetes API transport: the only importer of the `kubernetes` client.

- The client (tens of MB) is imported lazily, only when a feature that talks to the API server is
  on; importing this module costs nothing.
- A process that blocked `ssl` (`nvdp.base.ssl_block.block_ssl`) lifts the block before building one.
- One constructor, `new_api_client` (a host for tests, a kubeconfig, or the in-cluster service
  account), serves every user. The in-cluster account and plain kubeconfigs (a token or a client
  certificate) get nvdp's own transport over urllib3 (`nvdp.kube.transport`): importing any part
  of the `kubernetes` package imports the whole client, about 17 MiB of RSS. Other configurations
  (exec or auth-provider users, basic auth, proxies) get the client's ApiClient.
- Requests go through either untyped (JSON in and out, `request`): the typed models cost about
  22 MB more RSS. API failures are one-line KubeErrors.
- Every response body is read to its end before its connection returns to the pool; a watch stream
  left early closes its connection (`_watch_stream`): unread bytes would become the next request's
  status line (`BadStatusLine`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from nvdp.base.bounded import BoundExceeded, loads_json, loads_yaml
from nvdp.base.errors import KubeError, KubeGone, KubeStatusError, KubeWatchSilent, UnreadableFile
from nvdp.base.files import read_bounded
from nvdp.base.units import MIB
from nvdp.kube.transport import LightClient, light_client, lines

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
MAX_ANSWER_BYTES = 64 * MIB  # an answer (a list of a node's pods, say) or a watch event, decoded


def in_cluster(environ: Mapping[str, str], token_file: str = SERVICE_ACCOUNT_TOKEN) -> bool:
    """In-cluster credentials are present (KUBERNETES_SERVICE_HOST and the service-account token)."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(token_file)


def new_api_client(
    *, kubeconfig: str | None = None, host: str | None = None, token: str | None = None, retries: int = 1
) -> Any:
    """The one way to build an API client (a LightClient where `nvdp.kube.transport` can serve the
    configuration, else a `kubernetes.client.ApiClient`): `host` (+ bearer `token`) points at a
    server directly (tests: a local stand-in); else the `kubeconfig` file (KUBECONFIG /
    --kubeconfig); else the in-cluster service account. `retries`: urllib3's own retries of a failed
    connection (0 where the caller retries with backoff). Raises KubeError (one line) when no
    configuration can be loaded. A process that blocked `ssl` lifts the block first."""
    if host is not None:
        return LightClient(host, token=token or "", retries=retries)
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise KubeError(f"cannot load kubeconfig {kubeconfig}: no such file")
    if kubeconfig:
        _check_kubeconfig(kubeconfig)
    light = light_client(kubeconfig=kubeconfig, retries=retries)
    if light is not None:
        return light
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError) as error:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
        raise KubeError(f"cannot load {where}: {' '.join(str(error).split())}") from error
    configuration.retries = retries
    return client.ApiClient(configuration)


def _check_kubeconfig(path: str) -> None:
    """Raises KubeError (one line) when the kubeconfig at `path` is no small regular file of bounded
    YAML: the client would read `/dev/zero` for ever, and recurse out of its stack on deep nesting."""
    import yaml

    try:
        loads_yaml(read_bounded(path))
    except (UnreadableFile, BoundExceeded, yaml.YAMLError, ValueError) as error:
        raise KubeError(f"cannot load kubeconfig {path}: {one_line(error)}") from error


def get_json(api_client: Any, path: str, query: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """One GET and its JSON object (a list: `items` and `metadata.resourceVersion`). Raises
    KubeStatusError (KubeGone for 410) on an error status, else KubeError (one line)."""
    try:
        data = loads_json(request(api_client, "GET", path, query, timeout), max_bytes=MAX_ANSWER_BYTES)
    except KubeError:
        raise
    except Exception as error:  # urllib3 / socket errors, a body that is no JSON
        raise KubeError(one_line(error)) from error
    if not isinstance(data, dict):
        raise KubeError(f"unexpected answer from {path}")
    return data


@dataclass(frozen=True)
class BadLine:
    """A watch stream's line that could not be decoded: why, and its start."""

    reason: str
    text: str


def watch(
    api_client: Any, path: str, query: Mapping[str, str], *, silence: float
) -> Generator[object, None, None]:
    """The events of one watch request (`query` has `watch=true`), decoded JSON, unchecked (a line that
    is no JSON: a BadLine), until the server ends the stream; `close()` the generator to leave early
    (its connection is then closed, not reused).
    An ERROR event raises KubeStatusError (KubeGone for 410); a stream that says nothing, not even
    its headers, for `silence` s (a half-open connection, a stalled server) raises KubeWatchSilent;
    any other failure KubeError (one line)."""
    heard = time.monotonic()
    try:
        with _watch_stream(api_client, path, query, (10, silence)) as response:
            for line in lines(response):
                heard = time.monotonic()
                if not line.strip():
                    continue
                try:
                    event = loads_json(line, max_bytes=MAX_ANSWER_BYTES)
                except ValueError as error:  # no JSON, too big or deep, no UTF-8
                    yield BadLine(one_line(error), line[:100])
                    continue
                if isinstance(event, dict) and event.get("type") == "ERROR":
                    status = event.get("object")
                    status = status if isinstance(status, dict) else {}
                    raise _status_error(int(status.get("code") or 0), status.get("message") or status, "")
                yield event
    except KubeError:
        raise
    except Exception as error:
        if _is_read_timeout(error):
            raise KubeWatchSilent(silence, heard) from error
        raise KubeError(one_line(error)) from error


def _send(
    api_client: Any,
    method: str,
    path: str,
    query: Mapping[str, str],
    timeout: float | tuple[float, float],
    body: object,
    content_type: str,
) -> Any:
    """One request through the client's ApiClient (auth, TLS, proxies from the kubeconfig). Returns
    the urllib3 response of a 2xx answer with its body unread: the caller reads it to the end or
    closes it (`_request`, `_watch_stream`). A non-2xx answer is read, its connection released,
    and raised as KubeStatusError (KubeGone for 410)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    if isinstance(api_client, LightClient):
        raw = api_client.send(method, path, query, timeout, body, headers)
    elif hasattr(api_client, "param_serialize"):  # clients >= 34 (openapi-generator): no raise on non-2xx
        serialized = api_client.param_serialize(
            method,
            path,
            query_params=list(query.items()) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        method, url, headers, body = serialized[0], serialized[1], serialized[2], serialized[3]
        response = api_client.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout
        )
        raw = response.response
    else:
        return _send_swagger(api_client, method, path, query, timeout, body, headers)
    if not 200 <= raw.status <= 299:
        with _released(raw):
            data = raw.data
        raise _status_error(raw.status, data, raw.reason)
    return raw


def _send_swagger(
    api_client: Any,
    method: str,
    path: str,
    query: Mapping[str, str],
    timeout: float | tuple[float, float],
    body: object,
    headers: dict[str, str],
) -> Any:
    """`_send` through a client older than 34 (swagger-codegen), which raises on a non-2xx answer."""
    from kubernetes.client.exceptions import ApiException

    try:
        return api_client.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=timeout,
        )
    except ApiException as error:  # the client read the answer's body into the exception
        raise _status_error(int(error.status or 0), error.body, error.reason) from error


def request(
    api_client: Any,
    method: str,
    path: str,
    query: Mapping[str, str],
    timeout: float | tuple[float, float],
    body: object = None,
    content_type: str = "application/json",
) -> bytes:
    """One request, its whole body read and its connection released in every case; the body of a
    2xx answer. Raises KubeStatusError (KubeGone for 410) on a non-2xx answer."""
    raw = _send(api_client, method, path, query, timeout, body, content_type)
    with _released(raw):
        return bytes(raw.data or b"")


@contextmanager
def _watch_stream(
    api_client: Any, path: str, query: Mapping[str, str], timeout: float | tuple[float, float]
) -> Iterator[Any]:
    """A streaming GET (a watch): the urllib3 response. A stream read to its end releases its
    connection; one left early (stop, an ERROR event, a timeout) is closed, never handed back."""
    raw = _send(api_client, "GET", path, query, timeout, None, "application/json")
    with _released(raw):
        yield raw


@contextmanager
def _released(raw: Any) -> Iterator[None]:
    """Hand `raw`'s connection back to the pool when the block read the body to its end (urllib3
    closes the file there); close it when the block raised or left bytes unread (the next request
    on it would read them as its status line)."""
    complete = False
    try:
        yield
        complete = bool(raw.isclosed())
    finally:
        if not complete:
            raw.close()
        raw.release_conn()


def _status_error(status: int, body: object, reason: object) -> KubeStatusError:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        detail = loads_json(text, max_bytes=MAX_ANSWER_BYTES).get("message") or reason
    except (ValueError, AttributeError):
        detail = text or reason
    return (KubeGone if status == 410 else KubeStatusError)(status, str(detail), str(reason or ""))


def _is_read_timeout(error: BaseException) -> bool:
    from urllib3.exceptions import ReadTimeoutError

    seen: BaseException | None = error
    while seen is not None:  # urllib3 wraps socket timeouts; the client may wrap urllib3's errors
        if isinstance(seen, ReadTimeoutError | TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def strings(mapping: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in mapping.items()} if isinstance(mapping, Mapping) else {}


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
