"""Keeping the plugin process small (the budget is 45 MB peak RSS on every GPU node).

grpc imports asyncio, and asyncio imports `ssl` when it can: 4.5 MB of OpenSSL mapped into the
process, although gRPC over a unix socket never uses Python's ssl (grpc has its own TLS). The plugin
process blocks that import from the start and lifts the block only when a feature that really talks
TLS is switched on (Kubernetes Node events, through the `kubernetes` client).
"""

from __future__ import annotations

import importlib
import sys

# `_hashlib` is hashlib's OpenSSL backend (libcrypto, ~4 MB); without it hashlib uses CPython's own
# implementations, which give the same digests.
_BLOCKED = ("ssl", "_hashlib")


def block_ssl() -> None:
    """Make `import ssl` raise ImportError (asyncio and http.client treat that as "no TLS") and keep
    hashlib off OpenSSL."""
    for name in _BLOCKED:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def allow_ssl() -> None:
    """Undo block_ssl(): the next `import ssl` loads it, and modules that looked for ssl while it was
    blocked and keep their TLS parts optional (http.client) are loaded again with it."""
    if "ssl" in sys.modules and sys.modules["ssl"] is None:
        for name in _BLOCKED:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        importlib.import_module("ssl")
        if "http.client" in sys.modules:
            importlib.reload(sys.modules["http.client"])
