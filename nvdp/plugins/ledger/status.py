"""`nvdp status`: the node's device allocations, read from the plugin's /allocations page and printed
as one screen of text (`nvdp.plugins.ledger.report`).

It finds the plugin the way the plugin is told where to listen: `--metrics-address` / METRICS_ADDRESS
(in the plugin's container the variable is already set, so `kubectl exec ... -- nvdp status` needs no
flag); an address without a host (":2112") is read at 127.0.0.1. A plugin that does not answer, or
answers without the page, is one line of error.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from nvdp.base.bounded import loads_json
from nvdp.base.errors import NvdpError
from nvdp.base.http_endpoint import parse_address
from nvdp.config.options import flag
from nvdp.config.runtime import DEFAULT_METRICS_ADDRESS, listen_address

READ_TIMEOUT_S = 10.0
MAX_PAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class StatusFlags:
    metrics_address: str = DEFAULT_METRICS_ADDRESS


STATUS_OPTIONS = (
    flag(
        "--metrics-address $METRICS_ADDRESS",
        listen_address,
        "the plugin's metrics address, where it serves /allocations (no host: 127.0.0.1)",
        empty="value",  # as the plugin reads it: "" is its endpoint turned off
    ),
)


def allocations_url(address: str) -> str:
    """The URL of /allocations on the plugin listening at `address`."""
    if not address:
        raise NvdpError("the plugin's metrics endpoint is off (--metrics-address empty): nothing to read")
    host, port = parse_address(address)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/allocations"


def read_allocations(url: str, timeout: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """The /allocations document at `url`. Raises NvdpError (one line)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read(MAX_PAGE_BYTES + 1)
    except urllib.error.HTTPError as error:
        why = (
            "not served there (a plugin without the allocation ledger?)"
            if error.code == 404
            else error.reason
        )
        raise NvdpError(f"cannot read {url}: HTTP {error.code}: {why}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise NvdpError(
            f"cannot read {url}: {reason} (is the plugin running with this metrics address?)"
        ) from error
    try:
        document = loads_json(body, max_bytes=MAX_PAGE_BYTES)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise NvdpError(f"cannot read {url}: the answer is not an allocations document")
    return document
