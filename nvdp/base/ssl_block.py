"""Keeping ssl and OpenSSL out of the plugin process until a TLS client needs them (the plugin's
budget is 45 MB peak RSS on every GPU node).

grpc imports asyncio, and asyncio imports `ssl` when it can: 4.5 MB of OpenSSL mapped into the
process, although gRPC over a unix socket never uses Python's ssl (grpc has its own TLS). The plugin's
entry point (`nvdp plugin`, and only it) calls `block_ssl()` before anything imports grpc. The block
lifts itself when a TLS client is imported (the `kubernetes` client, for Node events): nothing else
in the program needs to know about it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

# `_hashlib` is hashlib's OpenSSL backend (libcrypto, ~4 MB); without it hashlib uses CPython's own
# implementations, which give the same digests.
_BLOCKED = ("ssl", "_hashlib")
# Importing one of these (top-level names) lifts the block first: they talk TLS.
TLS_CLIENTS = ("kubernetes", "urllib3")


class _LiftOnTlsClientImport:
    """A meta path finder that finds nothing itself: it lifts the block when a TLS client is about
    to be imported. (Not an `importlib.abc.MetaPathFinder`: importing that module loads
    importlib.resources and tempfile, which the plugin's start-up does not need.)"""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in TLS_CLIENTS:
            _unblock()  # stays on sys.meta_path (inert): the import system is iterating over it now
        return None


_LIFT = _LiftOnTlsClientImport()


def block_ssl() -> None:
    """Make `import ssl` raise ImportError (asyncio and http.client treat that as "no TLS") and keep
    hashlib off OpenSSL, until a TLS client (`TLS_CLIENTS`) is imported."""
    for name in _BLOCKED:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
    if _LIFT not in sys.meta_path:
        sys.meta_path.insert(0, _LIFT)


def _unblock() -> None:
    if "ssl" in sys.modules and sys.modules["ssl"] is None:
        for name in _BLOCKED:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        importlib.import_module("ssl")
        if "http.client" in sys.modules:
            importlib.reload(sys.modules["http.client"])
