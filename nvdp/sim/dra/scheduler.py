"""The scheduler's part of DRA, for the stand-ins (pure): a ResourceClaim's requests allocated from the
ResourceSlices' devices, as `status.allocation` (results, node selector).

- A request (`exactly`, or v1beta1's flat form) takes `count` devices (ExactCount) of a DeviceClass,
  the first candidates in slice order matching the class's selectors and its own.
- A candidate is held by no other claim nor by this one for another request, has no untolerated
  NoSchedule / NoExecute taint, and fits the pool's shared counters (KEP-4815, `counters`).
- Selectors are CEL; only these forms are evaluated, any other is refused in one line:
  `device.driver == 'gpu.nvidia.com'`, `device.attributes['gpu.nvidia.com'].type == 'mig'` or `!=`
  (string, integer, true / false), `device.allowMultipleAllocations == true` (unset: false),
  `T && T && ...`; `device.attributes['D'].name` is attribute `name` when D is the driver, else
  `D/name` (a device without it does not match).
- Consumable capacity (KEP-5075): an `allowMultipleAllocations` device is never taken whole; a result
  consumes each capacity's request rounded up by its `requestPolicy` (to `validRange.min`, then
  min + n * step, or the first `validValues` not below; none asked: `default`; no policy: all), and
  fails past `validRange.max`, off `validValues`, beyond what is left, or on a capacity the device
  lacks; it carries `consumedCapacity` and a `shareID`. Elsewhere a request is a lower bound.
- `extended_resource_claim` (KEP-5004) is the claim the scheduler makes for a pod asking an extended
  resource a DeviceClass names, where no device plugin advertises it; `allocate` allocates it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvdp.base.errors import NvdpError
from nvdp.base.units import parse_quantity
from nvdp.plugins.dra.devices import quantity
from nvdp.sim.dra.counters import Counters

Obj = Mapping[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)

_KEEP_OFF = ("NoSchedule", "NoExecute")  # taint effects that keep a device from new claims
_DRIVER = re.compile(r"^device\.driver\s*(==|!=)\s*(.+)$")
_MULTIPLE = re.compile(r"^device\.allowMultipleAllocations\s*(==|!=)\s*(.+)$")
_ATTRIBUTE = re.compile(r"^device\.attributes\[\s*'([^']+)'\s*\]\.([A-Za-z][A-Za-z0-9_]*)\s*(==|!=)\s*(.+)$")


EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
_GENERATED_NAME_LETTERS = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName alphabet


def nvidia_device_classes(
    driver: str = "gpu.nvidia.com", extended_resource_name: str = ""
) -> dict[str, dict[str, Any]]:
    """NVIDIA's DeviceClasses `gpu.nvidia.com` (whole GPUs) and `mig.nvidia.com` (MIG devices), as its
    chart installs them (and nvdp's chart, with `dra.enabled`); with `extended_resource_name`
    (NVIDIA's chart for resource.k8s.io/v1: `nvidia.com/gpu`) the GPU class carries it."""
    classes = {}
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        expression = f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'"
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
        if kind == "gpu" and extended_resource_name:
            spec["extendedResourceName"] = extended_resource_name
        classes[name] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": spec,
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
        elif (m := _MULTIPLE.match(term)) is not None:
            operator, equal = m[1], bool(device.get("allowMultipleAllocations")) is _literal(m[2], expression)
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
    consumed: Mapping[DeviceKey, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """The claim's `status.allocation` on `node` (its slices only); `consumed`: what other claims'
    shares take of the devices that allow multiple allocations. Raises AllocationError."""
    devices = [
        ((s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]), d)
        for s in slices
        if (s.get("spec") or {}).get("nodeName") == node
        for d in s["spec"].get("devices") or []
    ]
    results = []
    used = set(taken)
    charged = {key: dict(c) for key, c in (consumed or {}).items()}  # with this claim's shares
    counters = Counters([s for s in slices if (s.get("spec") or {}).get("nodeName") == node], taken)
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
        asked = {
            k: parse_quantity(v) for k, v in ((wanted.get("capacity") or {}).get("requests") or {}).items()
        }
        matching = [
            (key, device)
            for key, device in devices
            if (key not in used or device.get("allowMultipleAllocations"))
            and all(
                _tolerated(t, tolerations) for t in device.get("taints") or [] if t.get("effect") in _KEEP_OFF
            )
            and all(selector_matches(e, key[0], device) for e in expressions)
        ]
        picked: list[tuple[DeviceKey, dict[str, int] | None]] = []
        for key, device in matching:
            fits, share = _share(asked, device, charged.get(key, {}))
            # partitionable devices: what they consume of the pool's shared counters must be left
            if len(picked) < count and fits and counters.fits(key):
                counters.take(key)
                picked.append((key, share))
                if share is None:
                    used.add(key)
                else:
                    charged[key] = {c: charged.get(key, {}).get(c, 0) + n for c, n in share.items()}
        if len(picked) < count:
            short = f" with {_said(asked)} to spare" if asked and matching else ""
            raise AllocationError(
                f"request {name}: {count} device(s) of class {class_name} wanted, "
                f"{len(picked)} free on node {node} match{short}"
            )
        for (d, p, n), share in picked:
            result: dict[str, Any] = {"request": name, "driver": d, "pool": p, "device": n}
            if share is not None:
                seed = f"{(claim.get('metadata') or {}).get('uid')}/{name}/{d}/{p}/{n}"
                result["shareID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, seed))
                result["consumedCapacity"] = {c: quantity(v)["value"] for c, v in sorted(share.items())}
            results.append(result)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    devices_out: dict[str, Any] = {"results": results}
    if config := allocation_config(claim, classes):
        devices_out["config"] = config
    return {"devices": devices_out, "nodeSelector": {"nodeSelectorTerms": [term]}}


def allocation_config(claim: Obj, classes: Mapping[str, Obj]) -> list[Obj]:
    """`status.allocation.devices.config` as the scheduler writes it: each request's DeviceClass
    configs (`source: FromClass`, for that request), then the claim's own (`FromClaim`)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    config: list[Obj] = []
    for request in devices.get("requests") or []:
        wanted = request.get("exactly") or request
        class_spec = (classes.get(wanted.get("deviceClassName", "")) or {}).get("spec") or {}
        for entry in class_spec.get("config") or []:
            config.append({"source": "FromClass", "requests": [request["name"]], **entry})
    for entry in devices.get("config") or []:
        config.append({"source": "FromClaim", **entry})
    return config


def _share(
    asked: Mapping[str, int], device: Obj, charged: Mapping[str, int]
) -> tuple[bool, dict[str, int] | None]:
    """Whether a request fits `device`, and what it takes of it: None (the whole device) or its
    share (a device that allows multiple allocations)."""
    capacity = device.get("capacity") or {}
    if any(name not in capacity for name in asked):
        return False, None
    if not device.get("allowMultipleAllocations"):
        return all(n <= parse_quantity(capacity[c]["value"]) for c, n in asked.items()), None
    share = {}
    for name, cap in capacity.items():
        share[name] = taken = _rounded(asked.get(name), cap)
        if _violates(taken, cap.get("requestPolicy")) or charged.get(name, 0) + taken > parse_quantity(
            cap["value"]
        ):
            return False, None
    return True, share


def _rounded(asked: int | None, capacity: Obj) -> int:
    """A share of one capacity as its requestPolicy makes it."""
    policy = capacity.get("requestPolicy")
    if asked is None:
        return parse_quantity((policy or {}).get("default", capacity["value"]))
    valid_range, valid_values = (policy or {}).get("validRange"), (policy or {}).get("validValues")
    if valid_range and "min" in valid_range:
        low = parse_quantity(valid_range["min"])
        if asked < low or "step" not in valid_range:
            return max(asked, low)
        step = parse_quantity(valid_range["step"])
        return low + -(-(asked - low) // step) * step
    if valid_values:
        return next((v for v in map(parse_quantity, valid_values) if asked <= v), asked)
    return asked


def _violates(share: int, policy: Obj | None) -> bool:
    if not policy or ("default" in policy and share == parse_quantity(policy["default"])):
        return False
    valid_range, valid_values = policy.get("validRange"), policy.get("validValues")
    if valid_range:
        low = parse_quantity(valid_range.get("min", 0))
        over = "max" in valid_range and share > parse_quantity(valid_range["max"])
        return over or ("step" in valid_range and (share - low) % parse_quantity(valid_range["step"]) != 0)
    return bool(valid_values) and share not in {parse_quantity(v) for v in valid_values or ()}


def _said(asked: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {quantity(n)['value']}" for name, n in sorted(asked.items()))


def consumed_capacity(claims: Iterable[Obj]) -> dict[DeviceKey, dict[str, int]]:
    """What the shares of `claims` take of each device, capacity by capacity."""
    found: dict[DeviceKey, dict[str, int]] = {}
    for c in claims:
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            key = (r["driver"], r["pool"], r["device"])
            for name, amount in (r.get("consumedCapacity") or {}).items():
                found.setdefault(key, {})[name] = found.get(key, {}).get(name, 0) + parse_quantity(amount)
    return found


def taken_devices(claims: Iterable[Obj]) -> set[DeviceKey]:
    """The devices allocated to `claims` (a device is one claim's; a claim may be shared by pods)."""
    return {
        (r["driver"], r["pool"], r["device"])
        for c in claims
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    }


def extended_resource_classes(classes: Mapping[str, Obj]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that serves it: each class's `extendedResourceName`,
    and `deviceclass.resource.kubernetes.io/<class>` for every class. Two classes naming one resource:
    the one created later (`metadata.creationTimestamp`), then the name sorted first."""
    found = {IMPLICIT_EXTENDED_RESOURCE_PREFIX + name: name for name in classes}
    naming: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(classes):
        resource = (classes[name].get("spec") or {}).get("extendedResourceName")
        if resource:
            created = str((classes[name].get("metadata") or {}).get("creationTimestamp") or "")
            naming.setdefault(resource, []).append((created, name))
    for resource, named in naming.items():
        found[resource] = max(named, key=lambda n: n[0])[1]  # the first of the newest: sorted by name
    return found


def extended_resource_claim(
    pod: Obj, classes: Mapping[str, Obj], node: Obj
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The ResourceClaim the scheduler creates for the pod's extended resources that a DeviceClass
    serves and the node's allocatable does not have (a device plugin's > 0 wins), and the pod's
    `status.extendedResourceClaimStatus`; None when the pod asks none. One request per container
    (init containers first) and resource: `container-<i>-request-<j>`, j the resource's place among
    the container's sorted requests (limits stand for requests not given, as the API server defaults
    them). The claim is named `<pod>-extended-resources-<5 letters>` (generateName), annotated
    `resource.kubernetes.io/extended-resource-claim: "true"`, owned by the pod."""
    served = extended_resource_classes(classes)
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    spec, metadata = pod.get("spec") or {}, pod["metadata"]
    requests, mappings = [], []
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for i, container in enumerate(containers):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for j, resource in enumerate(sorted(wanted)):
            if resource not in served or _count(allocatable.get(resource, 0)) > 0:
                continue
            count = _count(wanted[resource])
            if count <= 0:
                continue
            name = f"container-{i}-request-{j}"
            exactly = {"deviceClassName": served[resource], "allocationMode": "ExactCount", "count": count}
            requests.append({"name": name, "exactly": exactly})
            mappings.append(
                {"containerName": container["name"], "resourceName": resource, "requestName": name}
            )
    if not requests:
        return None
    generate_name = f"{metadata['name']}-extended-resources-"
    claim_name = generate_name + _generated_suffix(str(metadata.get("uid") or metadata["name"]))
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": metadata["name"],
        "uid": metadata.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name,
            "generateName": generate_name,
            "namespace": metadata.get("namespace", "default"),
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [owner],
        },
        "spec": {"devices": {"requests": requests}},
    }
    return claim, {"requestMappings": mappings, "resourceClaimName": claim_name}


def _count(quantity: object) -> int:
    """An extended resource's quantity: a whole number."""
    text = str(quantity)
    if not re.fullmatch(r"[0-9]+", text):
        raise AllocationError(f"extended resource quantity {text!r}: only whole numbers are supported")
    return int(text)


def _generated_suffix(seed: str) -> str:
    """Five letters of the API server's generateName alphabet (the stand-in's: derived from `seed`)."""
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_GENERATED_NAME_LETTERS[b % len(_GENERATED_NAME_LETTERS)] for b in digest[:5])
