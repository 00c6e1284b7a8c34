"""The API server's object rules the stand-in follows: field selectors, JSON merge and strategic merge
patches, Status objects."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


def fields_match(obj: Obj, query: Mapping[str, str]) -> bool:
    """Whether `obj` has every `field=value` of the field selector but metadata.name (by path)."""
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name":
            continue
        found: Any = obj
        for part in key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if str(found) != value.lstrip("="):
            return False
    return True


def field_name(query: Mapping[str, str]) -> str | None:
    selector = query.get("fieldSelector", "")
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if key == "metadata.name":
            return value.lstrip("=")
    return None


def merge_patch(target: Any, patch: Any) -> Any:
    """`target` with a JSON merge patch (RFC 7386) applied; neither is changed."""
    return _patched(target, patch, {})


MERGE_KEYS = {"conditions": "type"}  # lists a strategic merge patch merges by key (Node status)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """`target` with a strategic merge patch applied: a merge patch, but for the lists of MERGE_KEYS,
    whose items are merged by their key (an item of a new key is appended; `"$patch": "delete"`
    removes the item of its key)."""
    return _patched(target, patch, MERGE_KEYS)


def _patched(target: Any, patch: Any, merge_keys: Mapping[str, str]) -> Any:
    """A merge patch whose lists named in `merge_keys` are merged by that key of their items."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in merge_keys and isinstance(value, list) and isinstance(merged.get(key), list):
            items: list[Any] = merged[key]
            by_key = {item.get(merge_keys[key]): n for n, item in enumerate(items) if isinstance(item, dict)}
            for item in value:
                n = by_key.get(item.get(merge_keys[key])) if isinstance(item, dict) else None
                if isinstance(item, dict) and item.get("$patch") == "delete":
                    if n is not None:  # the directive removes the item of that key
                        items[n] = None
                    continue
                if n is None:
                    items.append(copy.deepcopy(item))
                else:
                    items[n] = _patched(items[n], item, merge_keys)
            merged[key] = [item for item in items if item is not None]
        else:
            merged[key] = _patched(merged.get(key), value, merge_keys)
    return merged


def status_object(code: int, message: str) -> Obj:
    reasons = {404: "NotFound", 410: "Expired", 500: "InternalError", 409: "AlreadyExists"}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reasons.get(code, "Unknown"),
        "code": code,
    }
