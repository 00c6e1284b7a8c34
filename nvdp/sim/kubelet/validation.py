"""What the kubelet checks in a RegisterRequest before it dials the plugin (pure).

The messages follow the kubelet's device manager word for word where it has one, so a plugin tested
against the stand-in logs what it would log against a real kubelet.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from nvdp.api import API_VERSION

SUPPORTED_VERSIONS = (API_VERSION,)

# The kubelet turns an extended resource name into a quota name by prefixing "requests." and requires
# a Kubernetes qualified name: an optional DNS-1123 subdomain prefix, "/", a name of at most 63 chars.
_QUOTA_PREFIX = "requests."
_NATIVE_NAMESPACE = "kubernetes.io/"
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """True for a name a plugin may register: `nvidia.com/gpu`, not `gpu`, not `kubernetes.io/gpu`."""
    if "/" not in name or _NATIVE_NAMESPACE in name or name.startswith(_QUOTA_PREFIX):
        return False
    prefix, _, short = (_QUOTA_PREFIX + name).partition("/")
    return (
        len(prefix) <= 253
        and _DNS1123_SUBDOMAIN.fullmatch(prefix) is not None
        and 0 < len(short) <= 63
        and _QUALIFIED_NAME.fullmatch(short) is not None
    )


def _go_quote_list(items: tuple[str, ...]) -> str:
    return "[" + " ".join(f'"{item}"' for item in items) + "]"


def registration_problem(version: str, resource: str) -> str | None:
    """The kubelet's refusal message for a bad version or resource name, or None when both are fine."""
    if version not in SUPPORTED_VERSIONS:
        return (
            f'requested API version "{version}" is not supported by kubelet. '
            f"Supported version is {_go_quote_list(SUPPORTED_VERSIONS)}"
        )
    if not is_extended_resource_name(resource):
        return f'the ResourceName "{resource}" is invalid'
    return None


def endpoint_problem(plugin_dir: Path, endpoint: str) -> str | None:
    """Why `endpoint` cannot be dialed: it must name a unix socket in the plugin directory.

    The real kubelet finds this out by dialing (and waits up to 10 s); the stand-in says it at once,
    with the kubelet's "failed to dial device plugin:" prefix.
    """
    path = plugin_dir / endpoint
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return f"failed to dial device plugin: endpoint {endpoint!r} does not exist in {plugin_dir}"
    if not endpoint or not stat.S_ISSOCK(mode):
        return f"failed to dial device plugin: endpoint {endpoint!r} in {plugin_dir} is not a unix socket"
    return None
