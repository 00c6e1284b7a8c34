"""Which ConfigMap entry a node gets: the label value, else the default config, else the fallback
strategies in order (NVIDIA's rules). `list_entries` reads the mounted ConfigMap directory; `select`
is pure. The empty config is the entry name "" (the plugin then runs on flags and defaults).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from nvdp.base.errors import SelectionError as SelectionError  # defined in nvdp.base.errors
from nvdp.side.configmanager.settings import NAMED_FALLBACK

EMPTY = ""  # the `empty` fallback: no file at all


def list_entries(srcdir: str | Path) -> list[str]:
    """The entry names in a mounted ConfigMap directory, sorted: regular files (or links to them)
    whose names do not start with `..` (the kubelet's `..data` and `..<timestamp>` indirections)."""
    try:
        with os.scandir(srcdir) as found:
            names = [e.name for e in found if not e.name.startswith("..") and e.is_file()]
    except OSError as error:
        raise SelectionError(f"cannot list {srcdir}: {error.strerror or error}") from error
    return sorted(names)


def select(label: str | None, entries: Sequence[str], default: str, fallbacks: Sequence[str]) -> str:
    """The entry to use. `label` None or "" means the node has no value. Raises SelectionError."""
    if label:
        if label not in entries:
            raise SelectionError(f"no config entry named {label!r} (entries: {_names(entries)})")
        return label
    if default:
        if default not in entries:
            raise SelectionError(f"default config {default!r} is not an entry (entries: {_names(entries)})")
        return default
    for strategy in fallbacks:
        if strategy == "named" and NAMED_FALLBACK in entries:
            return NAMED_FALLBACK
        if strategy == "single" and len(entries) == 1:
            return entries[0]
        if strategy == "empty":
            return EMPTY
    tried = ", ".join(fallbacks) or "none configured"
    raise SelectionError(
        f"no label value, no default config, and no fallback strategy applies (tried: {tried};"
        f" entries: {_names(entries)})"
    )


def _names(entries: Sequence[str]) -> str:
    return ", ".join(entries) if entries else "none"
