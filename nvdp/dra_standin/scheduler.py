"""The scheduler's part of DRA, for the stand-ins (pure): allocate a ResourceClaim's requests from the
devices the ResourceSlices publish, as `status.allocation` (results, node selector).

A request (`exactly`, or v1beta1's flat form) asks for `count` devices (allocation mode ExactCount)
of a DeviceClass, matching the class's selectors and its own. A device is a candidate when no other
claim holds it, this claim has not taken it for another request, and it carries no NoSchedule or
NoExecute taint the request does not tolerate. The first candidates in slice order are taken.

Selectors are CEL expressions; this stand-in evaluates the forms NVIDIA's DeviceClasses and the usual
claims use, and refuses any other with a line that says so (no CEL engine here):

    device.driver == 'gpu.nvidia.com'
    device.attributes['gpu.nvidia.com'].type == 'mig'          (a string, an integer, true / false)
    device.attributes['gpu.nvidia.com'].profile != '1g.5gb'
    TERM && TERM && ...

An attribute `device.attributes['D'].name` is the device's attribute `name` when D is its driver's
name, else its attribute `D/name`; a device without it does not match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvdp.errors import NvdpError

Obj = Mapping[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)

_KEEP_OFF = ("NoSchedule", "NoExecute")  # taint effects that keep a device from new claims
_DRIVER = re.compile(r"^device\.driver\s*(==|!=)\s*(.+)$")
_ATTRIBUTE = re.compile(r"^device\.attributes\[\s*'([^']+)'\s*\]\.([A-Za-z][A-Za-z0-9_]*)\s*(==|!=)\s*(.+)$")


def nvidia_device_classes(driver: str = "gpu.nvidia.com") -> dict[str, dict[str, Any]]:
    """NVIDIA's DeviceClasses `gpu.nvidia.com` (whole GPUs) and `mig.nvidia.com` (MIG devices), as its
    chart installs them (and nvdp's chart, with `dra.enabled`)."""
    classes = {}
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        expression = f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'"
        classes[name] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
    return classes


class AllocationError(NvdpError):
    """A claim cannot be allocated (one line: which request, why)."""


def selector_matches(expression: str, driver: str, device: Obj) -> bool:
    """Whether `device` (a slice's device entry) of `driver` satisfies the CEL `expression`.
    Raises AllocationError for a form this stand-in does not evaluate."""
    for term in (t.strip() for t in expression.split("&&")):
        if (m := _DRIVER.match(term)) is not None:
            operator, equal = m[1], driver == _literal(m[2], expression)
        elif (m := _ATTRIBUTE.match(term)) is not None:
            domain, name, operator, value = m[1], m[2], m[3], _literal(m[4], expression)
            found = (device.get("attributes") or {}).get(name if domain == driver else f"{domain}/{name}")
            if not isinstance(found, Mapping) or len(found) != 1:
                return False  # no such attribute: CEL would fail on it; the device is not taken
            ((kind, have),) = found.items()
            equal = _same(kind, have, value)
        else:
            raise AllocationError(f"selector {expression!r}: {term!r} is a form the stand-in cannot evaluate")
        if equal != (operator == "=="):
            return False
    return True


def _same(kind: str, have: object, value: str | int | bool) -> bool:
    """An attribute value (of its kind) equals a literal of the same type."""
    if kind in ("string", "version"):
        return isinstance(value, str) and have == value
    if kind == "bool":
        return isinstance(value, bool) and have is value
    return kind == "int" and isinstance(value, int) and not isinstance(value, bool) and have == value


def _literal(text: str, expression: str) -> str | int | bool:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    raise AllocationError(f"selector {expression!r}: {text!r} is not a literal the stand-in scheduler reads")


def _tolerated(taint: Obj, tolerations: Iterable[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("key") not in (None, "", taint.get("key")):
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


def allocate(
    claim: Obj,
    classes: Mapping[str, Obj],
    slices: Sequence[Obj],
    taken: set[DeviceKey],
    node: str,
) -> dict[str, Any]:
    """The claim's `status.allocation` on `node` (its slices only). Raises AllocationError."""
    devices = [
        ((s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]), d)
        for s in slices
        if (s.get("spec") or {}).get("nodeName") == node
        for d in s["spec"].get("devices") or []
    ]
    results = []
    used = set(taken)
    for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
        name = request["name"]
        wanted = request.get("exactly") or request  # v1 / v1beta2, or v1beta1's flat request
        mode, count = wanted.get("allocationMode", "ExactCount"), int(wanted.get("count", 1))
        if "firstAvailable" in request or mode != "ExactCount":
            raise AllocationError(f"request {name}: only ExactCount requests are supported by the stand-in")
        class_name = wanted.get("deviceClassName", "")
        if class_name not in classes:
            raise AllocationError(f"request {name}: no DeviceClass {class_name!r}")
        class_spec = classes[class_name].get("spec") or {}
        selectors = [*(class_spec.get("selectors") or []), *(wanted.get("selectors") or [])]
        expressions = [s["cel"]["expression"] for s in selectors]
        tolerations = wanted.get("tolerations") or []
        picked = [
            key
            for key, device in devices
            if key not in used
            and all(
                _tolerated(t, tolerations) for t in device.get("taints") or [] if t.get("effect") in _KEEP_OFF
            )
            and all(selector_matches(e, key[0], device) for e in expressions)
        ][:count]
        if len(picked) < count:
            raise AllocationError(
                f"request {name}: {count} device(s) of class {class_name} wanted, "
                f"{len(picked)} free on node {node} match"
            )
        used.update(picked)
        results += [{"request": name, "driver": d, "pool": p, "device": n} for d, p, n in picked]
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}


def taken_devices(claims: Iterable[Obj]) -> set[DeviceKey]:
    """The devices allocated to `claims` (a device is one claim's; a claim may be shared by pods)."""
    return {
        (r["driver"], r["pool"], r["device"])
        for c in claims
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    }
